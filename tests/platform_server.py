"""A stand-in for the Osmosis platform's local-eval import API, on 127.0.0.1.

The endpoints ``osmosis eval upload`` (osmosis-ai 0.3.8) calls: start an import
(``POST /api/cli/eval-runs/imports``, the file list), upload instructions for the files
still missing (``.../uploads``), a presigned ``PUT`` per file (here, on the same server),
``.../uploads/complete`` and ``.../finalize``. It keeps every file it received, every
request's headers, and can answer the next N uploads with a 503 (``fail_uploads``).
Run as a script it prints its URL and serves until killed.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import threading
import uuid
from typing import Any

from aiohttp import web


class PlatformServer:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.declared: dict[str, dict[str, Any]] = {}
        self.headers: list[dict[str, str]] = []
        self.fail_uploads = 0
        self.failed = 0
        self.finalized = False
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._session = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _result(self, status: str) -> dict[str, Any]:
        files = [
            {**meta, "state": "uploaded" if path in self.files else "pending"}
            for path, meta in sorted(self.declared.items())
        ]
        result: dict[str, Any] = {
            "session_id": self._session,
            "status": status,
            "expected_files": len(files),
            "uploaded_files": sum(f["state"] == "uploaded" for f in files),
            "files": files,
        }
        if status == "finalized":
            result.update(
                eval_run_id="er_1", eval_run_name="imported", platform_url=f"{self.url}/e/1"
            )
        return result

    async def _start(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        body = await request.json()
        self._session = uuid.uuid4().hex
        self.declared = {
            f["path"]: {"path": f["path"], "size": f["size"], "sha256": f["sha256"]}
            for f in body["files"]
        }
        return web.json_response(self._result("uploading"))

    async def _uploads(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        body = await request.json()
        return web.json_response(
            {
                "files": [
                    {
                        **self.declared[path],
                        "upload": {
                            "method": "simple",
                            "presigned_url": f"{self.url}/put/{path}",
                        },
                    }
                    for path in body["paths"]
                    if path not in self.files
                ]
            }
        )

    async def _put(self, request: web.Request) -> web.Response:
        if self.fail_uploads > 0:
            self.fail_uploads -= 1
            self.failed += 1
            return web.Response(status=503, text="unavailable")
        path = request.match_info["path"]
        data = await request.read()
        meta = self.declared.get(path)
        if meta is None or hashlib.sha256(data).hexdigest() != meta["sha256"]:
            return web.Response(status=400, text="unexpected file")
        self.files[path] = data
        return web.Response(status=200, headers={"ETag": '"etag"'})

    async def _complete(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        return web.json_response({})

    async def _finalize(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        if set(self.files) != set(self.declared):
            return web.json_response({"error": "files missing"}, status=409)
        self.finalized = True
        return web.json_response(self._result("finalized"))

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        base = "/api/cli/eval-runs/imports"
        app.router.add_post(base, self._start)
        app.router.add_post(base + "/{session}/uploads", self._uploads)
        app.router.add_post(base + "/{session}/uploads/complete", self._complete)
        app.router.add_post(base + "/{session}/finalize", self._finalize)
        app.router.add_put("/put/{path:.+}", self._put)
        return app

    async def _serve(self) -> None:
        self._runner = web.AppRunner(self.make_app())
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def start(self) -> PlatformServer:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(30)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)


if __name__ == "__main__":
    server = PlatformServer().start()
    print(server.url, flush=True)
    sys.stdin.read()
