"""Model access: everything between a rollout's model call and the provider, in one place.

Route resolution and provider/key rules (`routes`), the one lazy LiteLLM import
(`litellm`), the wire format (`wire`), the loopback server (`bridge`), provider errors as
one line (`errors`), the session-start preflight (`preflight`), the embedded model
(`embedded`), the shared pacing after a 429 (`ratelimit`), the model-call cache (`cache`) and
the rollouts' ready client for the bridge (`client`, which imports httpx). Nothing here
imports pytest or the rubric judge: the judge (`pytest_osmosis.rubric.judge`) uses this
package, never the reverse.
Importing a module here imports neither LiteLLM nor aiohttp (~3 s); the calls do.
"""
