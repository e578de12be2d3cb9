import json
from pathlib import Path

import polars as pl
from dagster import ConfigurableIOManager, InputContext, OutputContext

from rvu_pipelines.atomic_write import atomic_path, write_atomically
from rvu_pipelines.paths import state_dir


class LocalTableIOManager(ConfigurableIOManager):
    """Stores polars frames as parquet and plain records as JSON under .rvu/assets (never pickle).

    Files are written to a temporary name and renamed, so a failed run never leaves a torn file.
    """

    base_dir: str | None = None

    def _path(self, context: OutputContext | InputContext, suffix: str) -> Path:
        root = Path(self.base_dir) if self.base_dir else state_dir() / "assets"
        parts = list(context.asset_key.path)
        if context.has_asset_partitions:
            parts.append(context.asset_partition_key)
        path = root.joinpath(*parts).with_suffix(suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def handle_output(self, context: OutputContext, obj: object) -> None:
        if obj is None:
            return
        if isinstance(obj, pl.DataFrame):
            path = self._path(context, ".parquet")
            with atomic_path(path) as temp:
                obj.write_parquet(temp)
        else:
            path = self._path(context, ".json")
            write_atomically(path, json.dumps(obj, indent=1, sort_keys=True, default=str))
        context.add_output_metadata({"path": str(path)})

    def load_input(self, context: InputContext) -> object:
        parquet, record = self._path(context, ".parquet"), self._path(context, ".json")
        if parquet.exists():
            return pl.read_parquet(parquet)
        if record.exists():
            return json.loads(record.read_text())
        raise FileNotFoundError(
            f"Upstream asset {context.asset_key.to_user_string()} has no stored output at {parquet} or {record}; "
            "materialize it first."
        )
