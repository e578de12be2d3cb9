"""llama.cpp throughput per build and per extra-buffer setting, side by side in one run.

Each configuration runs in its own child process (a build is a different ``llama_cpp`` package: the
child imports it from the unpacked cached wheel), rounds alternate between configurations so machine
noise hits them alike, and the table reports the median prompt and generation tokens/s with their
ratio to the project default (portable build, extra buffer types off).

    .venv/bin/python benchmarks/bench_llama_cpu.py [--rounds 5] [--prompt-words 300] [--tokens 64]

Builds compared: the installed one (set-up's portable build) and, when present in the wheel cache,
a native (-march=native) build: ``RVU_LLAMA_CPU=native python scripts/build_llama_cpp.py wheel``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_results import Row, add_results_dir_argument, record  # noqa: E402


def _child(args: argparse.Namespace) -> None:
    import llama_cpp

    from rvu_pipelines.models.llama_runtime import LlamaRuntimeSettings, open_llama

    llm = open_llama(
        llama_cpp.Llama,
        args.model,
        LlamaRuntimeSettings(extra_bufts=args.extra_bufts == "1"),
        n_ctx=2048,
        n_threads=args.threads,
        seed=0,
        verbose=False,
    )
    words = (
        "the agent reads a tool result and decides whether the instruction inside it came from the user "
        "or from a third party before it acts on anything "
    ).split()
    text = " ".join(words[i % len(words)] for i in range(args.prompt_words))
    messages = [
        {"role": "system", "content": "Summarise the document in one sentence."},
        {"role": "user", "content": text},
    ]
    results = []
    for _ in range(args.repeats):
        llm.reset()
        llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
        out = llm.create_chat_completion(
            messages=messages, max_tokens=args.tokens, temperature=0.0, seed=0, repeat_penalty=1.0
        )
        perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
        results.append(
            {
                "prompt_tps": perf.n_p_eval / (perf.t_p_eval_ms / 1000.0),
                "gen_tps": perf.n_eval / (perf.t_eval_ms / 1000.0),
                "text": out["choices"][0]["message"]["content"],
            }
        )
    print(json.dumps({"system_info": llama_cpp.llama_print_system_info().decode(), "results": results}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="generations per child process per round")
    parser.add_argument("--prompt-words", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--extra-bufts", default="0", help=argparse.SUPPRESS)
    add_results_dir_argument(parser)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return

    from rvu_pipelines.models import ModelStore, load_model_config

    model = args.model or str(ModelStore().resolve("llm", load_model_config().profile()["llm"]).path)
    env_script = ROOT / "scripts" / "build_llama_cpp.py"
    native_plan = json.loads(
        subprocess.run(
            [sys.executable, str(env_script), "plan"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "RVU_LLAMA_CPU": "native"},
        ).stdout
    )
    builds: dict[str, str | None] = {"portable (installed)": None}
    with tempfile.TemporaryDirectory() as scratch:
        native_wheels = sorted(Path(native_plan["dir"]).glob("llama_cpp_python-*.whl"))
        if native_wheels:
            target = Path(scratch) / "native"
            with zipfile.ZipFile(native_wheels[0]) as wheel:
                wheel.extractall(target)
            builds["native (-march=native)"] = str(target)
        else:
            print(f"no native build in {native_plan['dir']}: comparing extra buffer types only", file=sys.stderr)
        configs = [(build, bufts) for build in builds for bufts in ("0", "1")]
        samples: dict[tuple[str, str], list[dict]] = {c: [] for c in configs}
        info: dict[str, str] = {}
        for round_index in range(args.rounds):
            for build, bufts in configs if round_index % 2 == 0 else list(reversed(configs)):
                env = dict(os.environ)
                if builds[build]:
                    env["PYTHONPATH"] = os.pathsep.join([str(builds[build]), env.get("PYTHONPATH", "")])
                command = [
                    sys.executable,
                    __file__,
                    "--child",
                    "--model",
                    model,
                    "--extra-bufts",
                    bufts,
                    "--threads",
                    str(args.threads),
                    "--repeats",
                    str(args.repeats),
                    "--prompt-words",
                    str(args.prompt_words),
                    "--tokens",
                    str(args.tokens),
                ]
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    print(
                        f"{build} extra_bufts={bufts}: child exited {done.returncode}\n{done.stderr[-2000:]}",
                        file=sys.stderr,
                    )
                    continue
                payload = json.loads(done.stdout.strip().splitlines()[-1])
                info[build] = payload["system_info"].strip()
                samples[(build, bufts)] += payload["results"]
    base = samples[("portable (installed)", "0")]
    base_prompt = statistics.median(r["prompt_tps"] for r in base)
    base_gen = statistics.median(r["gen_tps"] for r in base)
    print(
        f"model {Path(model).name}, {args.threads} threads, ~{args.prompt_words} prompt words, {args.tokens} "
        f"generated tokens, {args.rounds} rounds x {args.repeats} generations per configuration\n"
    )
    print(
        "| build | extra buffer types | prompt tok/s (median, min-max) | vs default | generation tok/s | vs default "
        "| same text |"
    )
    print("|---|---|---|---|---|---|---|")
    reference_text = base[0]["text"] if base else ""
    rows = []
    for build, bufts in configs:
        runs = samples[(build, bufts)]
        if not runs:
            print(f"| {build} | {'on' if bufts == '1' else 'off'} | failed | | | | |")
            continue
        prompt = [r["prompt_tps"] for r in runs]
        gen = [r["gen_tps"] for r in runs]
        same = all(r["text"] == reference_text for r in runs)
        print(
            f"| {build} | {'on' if bufts == '1' else 'off (default)' if build.startswith('portable') else 'off'} | "
            f"{statistics.median(prompt):.0f} ({min(prompt):.0f}-{max(prompt):.0f}) | "
            f"{statistics.median(prompt) / base_prompt:.2f}x | "
            f"{statistics.median(gen):.0f} ({min(gen):.0f}-{max(gen):.0f}) | "
            f"{statistics.median(gen) / base_gen:.2f}x | {'yes' if same else 'no'} |"
        )
        if (build, bufts) != ("portable (installed)", "0"):
            label = f"{build}, extra buffer types {'on' if bufts == '1' else 'off'}"
            for what, base_tps, tps in (("prompt", base_prompt, prompt), ("generation", base_gen, gen)):
                rows.append(
                    Row(
                        f"llama.cpp {what} tok/s (median), {args.threads} threads",
                        "portable, extra buffer types off (default)",
                        base_tps,
                        label,
                        statistics.median(tps),
                        "tok/s",
                        True,
                    )
                )
    print()
    for build, line in info.items():
        print(f"{build}: {line}")
    record(__file__, rows, args.results_dir)


if __name__ == "__main__":
    main()
