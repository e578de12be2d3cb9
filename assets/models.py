"""Model assets: resolved weights per role, the manifest, and real smoke runs tracked in MLflow."""

from pathlib import Path

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    Config,
    MetadataValue,
    Output,
    asset,
)

from resources import EmbedderResource, LLMResource, MlflowTrackerResource, ModelStoreResource
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.models import ROLES
from rvu_pipelines.reporting import markdown_table
from rvu_pipelines.smoke import SMOKE_USER_PROMPT, run_embedder_smoke, run_llm_smoke

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

GROUP = "models"


def _model_asset(role: str) -> AssetsDefinition:
    name = f"{role}_model"

    @asset(
        code_version=CODE_VERSION,
        name=name,
        group_name=GROUP,
        description=f"The {role} weights of the active model profile (configs/models.yaml), resolved from a "
        "package, a local path or a pinned hub download and verified against the pinned sha256.",
        kinds={"json"},
        check_specs=[
            AssetCheckSpec(
                "sha256_pinned", asset=name, description="The weights match a pinned sha256 (warns when unpinned)."
            )
        ],
    )
    def _model(context: AssetExecutionContext, model_store: ModelStoreResource):
        resolved = model_store.resolve(role)
        record = resolved.record() | {"profile": model_store.profile_name()}
        context.log.info(f"{role}: {resolved.name} from {resolved.source} sha256 {resolved.sha256}")
        yield Output(record, metadata={k: MetadataValue.text(str(v)) for k, v in sorted(record.items())})
        yield AssetCheckResult(
            check_name="sha256_pinned",
            passed=resolved.pinned,
            severity=AssetCheckSeverity.WARN,
            metadata={
                "sha256": resolved.sha256,
                "fix": "" if resolved.pinned else f"pin sha256: {resolved.sha256} in configs/models.yaml",
            },
        )

    return _model


MANIFEST_COLUMNS = ["role", "name", "path", "source", "size_bytes", "sha256", "licence", "pinned", "profile"]


@asset(
    code_version=CODE_VERSION,
    group_name=GROUP,
    description="Manifest of the models in use: role, file, source, size, sha256 and licence of each.",
    kinds={"polars", "parquet"},
)
def model_manifest(llm_model: dict, embedder_model: dict) -> Output[pl.DataFrame]:
    frame = pl.DataFrame([llm_model, embedder_model]).select(MANIFEST_COLUMNS).sort("role")
    table = markdown_table(frame.drop("path"), max_width=100)
    return Output(frame, metadata={"dagster/row_count": frame.height, "manifest": MetadataValue.md(table)})


class LlmSmokeConfig(Config):
    prompt: str = SMOKE_USER_PROMPT
    max_tokens: int = 64
    seed: int = 0


@asset(
    code_version=CODE_VERSION,
    group_name=GROUP,
    description="A real deterministic chat completion (temperature 0, fixed seed) run twice with the profile's "
    "LLM; records prompt and generation tokens/s in MLflow and checks the two generations are identical.",
    kinds={"llama_cpp", "mlflow"},
    check_specs=[
        AssetCheckSpec(
            "deterministic",
            asset="llm_smoke",
            blocking=True,
            description="Two temperature-0 generations with the same seed are identical.",
        )
    ],
)
def llm_smoke(
    context: AssetExecutionContext,
    config: LlmSmokeConfig,
    llm_model: dict,
    llm: LLMResource,
    mlflow_tracker: MlflowTrackerResource,
):
    model = llm.build(Path(llm_model["path"]), n_ctx=int(llm_model["n_ctx"]), name=llm_model["name"])
    params = {
        "model": llm_model["name"],
        "model_sha256": llm_model["sha256"],
        "backend": llm.backend,
        "temperature": 0.0,
        "seed": config.seed,
        "max_tokens": config.max_tokens,
        "prompt": config.prompt,
    }
    with mlflow_tracker.run_for(context, params=params) as run:
        result = run_llm_smoke(model, user_prompt=config.prompt, max_tokens=config.max_tokens, seed=config.seed)
        first = result.first
        metrics = {
            "prompt_tokens": first.prompt_tokens,
            "completion_tokens": first.completion_tokens,
            "prompt_tokens_per_s": first.prompt_tokens_per_s,
            "generation_tokens_per_s": first.generation_tokens_per_s,
            "deterministic": float(result.deterministic),
        }
        run.log_metrics(metrics)
    record = {"text": first.text, "model": llm_model["name"], "mlflow_run_id": run.run_id, **metrics}
    yield Output(
        record,
        metadata={"generation": first.text, "mlflow_run_id": run.run_id, **{k: float(v) for k, v in metrics.items()}},
    )
    yield AssetCheckResult(
        check_name="deterministic",
        passed=result.deterministic,
        metadata={"first": first.text, "second": result.second.text},
    )


@asset(
    code_version=CODE_VERSION,
    group_name=GROUP,
    description="Embeds a paraphrase pair and an unrelated sentence with the profile's embedder; records the "
    "dimension, cosine similarities and sentences/s in MLflow and checks the paraphrase pair is closer.",
    kinds={"sentence_transformers", "mlflow"},
    check_specs=[
        AssetCheckSpec(
            "paraphrase_closer",
            asset="embedder_smoke",
            blocking=True,
            description="cos(paraphrase pair) > cos(unrelated pair).",
        )
    ],
)
def embedder_smoke(
    context: AssetExecutionContext,
    embedder_model: dict,
    embedder: EmbedderResource,
    mlflow_tracker: MlflowTrackerResource,
):
    with mlflow_tracker.run_for(
        context,
        params={"model": embedder_model["name"], "model_sha256": embedder_model["sha256"], "device": embedder.device},
    ) as run:
        result = run_embedder_smoke(embedder.build(Path(embedder_model["path"])))
        metrics = {
            "dimension": result.dimension,
            "paraphrase_cosine": result.paraphrase_cosine,
            "unrelated_cosine": result.unrelated_cosine,
            "sentences_per_s": result.sentences_per_s,
        }
        run.log_metrics(metrics)
    yield Output(
        {**metrics, "mlflow_run_id": run.run_id},
        metadata={"mlflow_run_id": run.run_id, **{k: float(v) for k, v in metrics.items()}},
    )
    yield AssetCheckResult(
        check_name="paraphrase_closer",
        passed=result.separates_paraphrase,
        metadata={k: float(v) for k, v in metrics.items()},
    )


def model_assets() -> list[AssetsDefinition]:
    return [_model_asset(role) for role in ROLES] + [model_manifest, llm_smoke, embedder_smoke]
