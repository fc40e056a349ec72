"""Which file a config's dataset names: `--osmosis-dataset-file`, else `data/<dataset>.*`."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from pytest_osmosis.core.errors import DatasetError
from pytest_osmosis.dataset.formats import dataset_extension, readers, suffixes
from pytest_osmosis.dataset.rows import short


def resolve_dataset_path(workspace: Path, dataset: str, dataset_file: Path | None) -> Path:
    """`dataset_file` when given, else the first of `data/<dataset>.<suffix>` by registry order."""
    formats = readers()  # a plugin's formats count in the lookup and in every message
    if dataset_file is not None:
        try:
            candidate = dataset_file.expanduser()
            is_file, exists = candidate.is_file(), candidate.exists()
        except (OSError, RuntimeError) as exc:  # a name too long, no home directory
            raise DatasetError(f"dataset file {dataset_file} cannot be used ({exc})") from None
        if not is_file:
            what = "is not a file" if exists else "does not exist"
            raise DatasetError(f"dataset file {candidate} {what}")
        dataset_extension(candidate)
        return candidate
    if not dataset or dataset in (".", "..") or any(sep in dataset for sep in ("/", "\\", "\0")):
        raise DatasetError(
            f"experiment.dataset {dataset!r} is not a dataset name: it is looked up as "
            f"data/<dataset>{suffixes('|')}, so it must be one path segment"
        )
    data_dir = workspace / "data"
    tried = [data_dir / f"{dataset}.{extension}" for extension in formats]
    for candidate in tried:
        try:
            if candidate.is_file():
                return candidate
        except OSError as exc:  # e.g. a name longer than the file system allows
            raise DatasetError(
                f"experiment.dataset {short(dataset)} cannot be looked up as "
                f"{short(candidate.name)} ({exc.strerror or exc})"
            ) from None
    hint = ""
    if Path(dataset).suffix.lstrip(".").lower() in formats:
        hint = f" (experiment.dataset is a name without extension: try {Path(dataset).stem!r})"
    else:
        hint = _other_datasets(data_dir, formats)
    raise DatasetError(
        f"no dataset file for experiment.dataset {dataset!r}: tried "
        f"{', '.join(str(path) for path in tried)}{hint}"
    )


def _other_datasets(data_dir: Path, formats: Collection[str]) -> str:
    """The hint of a name that matches no file: the datasets ``data/`` does hold (say, the
    file an SDK run was given with ``--dataset-file``), and the option that names a file."""
    try:
        held = sorted(
            path.name
            for path in data_dir.iterdir()
            if path.suffix.lstrip(".").lower() in formats and path.is_file()
        )
    except OSError:  # no data/ directory, or one that cannot be listed
        held = []
    shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
    holds = (
        f"data/ holds {shown}: name one in experiment.dataset without its extension, or "
        if held
        else "or "
    )
    return f" ({holds}give the file with --osmosis-dataset-file PATH)"
