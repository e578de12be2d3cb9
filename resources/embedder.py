from pathlib import Path

from dagster import ConfigurableResource

from rvu_pipelines.models.embedder import SentenceEmbedder


class EmbedderResource(ConfigurableResource):
    """Sentence-transformers embedder on the CPU by default."""

    device: str = "cpu"
    batch_size: int = 64

    def build(self, model_path: Path, name: str | None = None) -> SentenceEmbedder:
        return SentenceEmbedder(model_path, device=self.device, batch_size=self.batch_size, name=name)
