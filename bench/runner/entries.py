"""The benchmark suite: one table, the only definition of what runs, with which arguments,
for how long, on which machine. `bazel run //bench:suite` and the staged
`bash .stage/run.sh suite` both run it (bench/runner/suite.py).

An entry runs one program: a bench binary ("//bench:bench_models") or a PyTorch counterpart
("pytorch/amp_step.py"). `args(ctx)` gives its arguments for the machine and mode, or a
Skip(reason). `expect` and `timeout` are (full, quick) seconds on an H200; on the CPU the
quick arguments are small enough that the whole subset takes well under a minute.
Techniques group the entries in the report and are what --only selects.
"""
from dataclasses import dataclass
from typing import Callable, Union


@dataclass(frozen=True)
class Skip:
    reason: str


@dataclass(frozen=True)
class Context:
    quick: bool
    cuda: bool  # a CUDA device is visible
    gpus: int
    torch: bool  # `import torch` works
    tmp: str  # a scratch folder for files entries hand each other


@dataclass(frozen=True)
class Entry:
    name: str
    technique: str
    side: str  # memgrad | pytorch_eager | pytorch_compile (a JSON line may override it)
    program: str  # "//pkg:binary" or "pytorch/script.py"
    args: Callable[[Context], Union[list, Skip]]
    output: str = "lines"  # lines: JSON lines on stdout | gbench: Google Benchmark JSON | check: exit code
    needs_cuda: bool = True
    expect: tuple = (10, 5)
    timeout: tuple = (120, 60)


TECHNIQUES = {
    "models": "Whole-model training steps",
    "amp": "Mixed precision",
    "state": "Model state: 8-bit moments, optimizer and parameter offload",
    "recompute": "Activation recomputation",
    "optim": "Fused optimizers",
    "attention": "Attention kernels",
    "kernels": "Kernel bandwidth and GEMM",
    "allocator": "Caching allocator",
    "data": "Data pipeline",
    "distributed": "Data-parallel scaling",
    "interop": "Checkpoint interop with PyTorch",
}


def quick_or(quick_args, full_args):
    return lambda ctx: quick_args if ctx.quick else full_args


def steps(ctx, full=10, quick=5, cpu_quick=1):
    n = (quick if ctx.cuda else cpu_quick) if ctx.quick else full
    return ["--steps", str(n), "--warmup", "1" if ctx.quick else "3"]


def gbench(quick_filter, full_filter="."):
    """Google Benchmark flags: fewer, shorter runs in --quick; 3 repetitions for min/max otherwise."""
    def args(ctx):
        if ctx.quick:
            return [f"--benchmark_filter={quick_filter}", "--benchmark_min_time=0.05"]
        return [f"--benchmark_filter={full_filter}", "--benchmark_min_time=0.1", "--benchmark_repetitions=3"]
    return args


def needs_torch(args):
    return lambda ctx: args(ctx) if ctx.torch else Skip("PyTorch is not installed here (python3 -c 'import torch')")


def models_args(dtype, tf32=False):
    def args(ctx):
        if ctx.quick and (dtype != "bf16" or tf32):
            return Skip("--quick runs the bf16 rows only")
        return ["--dtype", dtype] + (["--tf32"] if tf32 else []) + steps(ctx)
    return args


def fp8_args(fp8, delayed=False):
    """GPT-2 XL's step in bf16 autocast with and without the FP8 recipe (current or delayed
    scaling): its time and what it keeps (the rows' peaks, split per parameter and per token).
    GPT-2 124M under --quick, every linear in FP8 there (the recipe's default keeps linears
    narrower than 1280 in bf16)."""
    def args(ctx):
        size = "gpt2" if ctx.quick else "gpt2-xl"
        recipe = (["--fp8"] + (["--fp8-min-features", "0"] if ctx.quick else []) +
                  (["--fp8-delayed"] if delayed else [])) if fp8 else []
        return (["--model", "gpt2", "--gpt", size, "--dtype", "bf16", "--optimizer", "adamw"] +
                recipe + steps(ctx))
    return args


def state_args(mode):
    """A GPT's AdamW step with its state where `mode` puts it: on the device (f32 or 8-bit moments),
    the block Linears' masters and moments in host memory (optimizer offload; of the last blocks
    only, as many as plan_host_param_blocks hides within 1.3x of the resident step), or every parameter
    there (parameter offload, one block fetched ahead). GPT-2 large uncapped (the modes' times side
    by side, and each row's peak split per parameter and per token), 124M under --quick."""
    def args(ctx):
        size = "gpt2" if ctx.quick else "gpt2-large"
        where = {"device": ["--optimizer", "adamw"], "8bit": ["--optimizer", "adamw8bit"],
                 "host_params": ["--optimizer", "adamw", "--host-params"],
                 "host_params_planned": ["--optimizer", "adamw", "--step-in-backward", "--host-param-blocks", "auto"],
                 "param_offload": ["--optimizer", "adamw", "--param-offload", "1"]}[mode]
        return ["--model", "gpt2", "--gpt", size, "--dtype", "bf16"] + where + steps(ctx)
    return args


def dist_args(ctx):
    if not ctx.cuda:  # a tiny model on host ranks: the path runs, the numbers are no scaling claim
        tiny = ["--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--vocab", "64", "--seq", "16", "--batch", "2"]
        return ["--compare", "2", "--backend", "cpu", "--steps", "2", "--warmup", "1"] + tiny
    if ctx.gpus < 2:
        return Skip(f"DDP scaling needs 2 or more GPUs; {ctx.gpus} visible")
    return ["--compare", str(ctx.gpus)] + steps(ctx, full=5, quick=3)


def data_args(ctx):
    if ctx.quick:
        return ["--images", "4000" if ctx.cuda else "1000", "--workers", "4" if ctx.cuda else "2", "--epochs", "1",
                "--decode-us", "50" if ctx.cuda else "20"]
    return ["--workers", "1,2,4,8,12"]


SUITE = [
    Entry("models_bf16", "models", "memgrad", "//bench:bench_models", models_args("bf16"), expect=(12, 8)),
    Entry("models_f32", "models", "memgrad", "//bench:bench_models", models_args("f32"), expect=(15, 0)),
    Entry("models_tf32", "models", "memgrad", "//bench:bench_models", models_args("f32", tf32=True), expect=(12, 0)),
    Entry("models_channels_last", "models", "memgrad", "//bench:bench_models",
          lambda ctx: ["--model", "resnet50", "--channels-last"] + models_args("bf16")(ctx), expect=(8, 5)),
    Entry("models_channels_last_f16", "models", "memgrad", "//bench:bench_models",
          lambda ctx: Skip("--quick runs the bf16 rows only") if ctx.quick else
          ["--model", "resnet50", "--channels-last"] + models_args("f16")(ctx), expect=(8, 0)),
    Entry("models_pytorch", "models", "pytorch_eager", "pytorch/models_step.py",
          needs_torch(lambda ctx: ["--rows", "bf16" if ctx.quick else "all"] + steps(ctx)), expect=(40, 15),
          timeout=(180, 90)),
    Entry("models_pytorch_compile", "models", "pytorch_compile", "pytorch/models_step.py",
          needs_torch(lambda ctx: Skip("--quick leaves torch.compile out (its compile time)") if ctx.quick else
                      ["--rows", "bf16", "--compile"] + steps(ctx)), expect=(100, 0), timeout=(200, 1)),
    Entry("amp", "amp", "memgrad", "//bench:bench_amp",
          lambda ctx: (["--model", "gpt2"] if ctx.quick else []) + steps(ctx), expect=(35, 8)),
    Entry("amp_pytorch", "amp", "pytorch_eager", "pytorch/amp_step.py",
          needs_torch(lambda ctx: ["--model", "gpt2" if ctx.quick else "all"] + steps(ctx)), expect=(45, 15),
          timeout=(240, 90)),
    Entry("amp_gpt_bf16", "amp", "memgrad", "//bench:bench_models", fp8_args(False), expect=(20, 8)),
    Entry("amp_gpt_fp8", "amp", "memgrad", "//bench:bench_models", fp8_args(True), expect=(20, 8)),
    Entry("amp_gpt_fp8_delayed", "amp", "memgrad", "//bench:bench_models", fp8_args(True, delayed=True),
          expect=(20, 8)),
    Entry("state_device", "state", "memgrad", "//bench:bench_models", state_args("device"), expect=(15, 8)),
    Entry("state_8bit", "state", "memgrad", "//bench:bench_models", state_args("8bit"), expect=(15, 8)),
    Entry("state_host_params", "state", "memgrad", "//bench:bench_models", state_args("host_params"),
          expect=(20, 10)),
    Entry("state_host_params_planned", "state", "memgrad", "//bench:bench_models", state_args("host_params_planned"),
          expect=(25, 12)),
    Entry("state_param_offload", "state", "memgrad", "//bench:bench_models", state_args("param_offload"),
          expect=(40, 15)),
    Entry("recompute", "recompute", "memgrad", "//bench:bench_recompute",
          lambda ctx: ["--dtype", "bf16" if ctx.cuda else "f32"] + (["--model", "gpt"] if ctx.quick else []) +
          steps(ctx), needs_cuda=False, expect=(25, 10)),
    Entry("recompute_pytorch", "recompute", "pytorch_eager", "pytorch/recompute_step.py",
          needs_torch(lambda ctx: ["--dtype", "bf16"] + steps(ctx)), expect=(20, 10)),
    # A quick run on a host without a GPU times the host update over 16M parameters, not 67M, to
    # stay well inside the entry's minute on a 2-core host (CI's).
    Entry("optim", "optim", "memgrad", "//bench:bench_optim",
          lambda ctx: ["--steps", "10" if ctx.quick else "50"] +
          (["--host-elems", str(1 << 24)] if ctx.quick and not ctx.cuda else []),
          needs_cuda=False, expect=(15, 5)),
    Entry("optim_pytorch", "optim", "pytorch_eager", "pytorch/optim_step.py",
          needs_torch(lambda ctx: ["--steps", "10" if ctx.quick else "50"]), expect=(20, 8)),
    Entry("attention", "attention", "memgrad", "//bench:bench_attention",
          gbench("BM_PackedQkvAttention|BM_Attention/0/0/1/"), output="gbench", expect=(45, 6), timeout=(150, 60)),
    Entry("attention_pytorch", "attention", "pytorch_eager", "pytorch/attention_sdpa.py",
          needs_torch(quick_or(["--shapes", "0", "--dtypes", "bf16", "--causal", "1"], [])), expect=(20, 8)),
    Entry("kernels", "kernels", "memgrad", "//bench:bench_cuda_kernels", gbench("."), output="gbench",
          expect=(20, 8)),
    Entry("allocator", "allocator", "memgrad", "//bench:bench_allocator",  # fake-device rows run on the CPU
          lambda ctx: gbench("BM_CachingAllocFree|BM_CudaMallocFree|BM_Trace" if ctx.cuda else "Fake|BM_Trace")(ctx),
          output="gbench", needs_cuda=False, expect=(20, 10)),
    Entry("data", "data", "memgrad", "//bench:bench_data", data_args, needs_cuda=False, expect=(25, 5)),
    Entry("data_pytorch", "data", "pytorch_eager", "pytorch/data_loader.py", needs_torch(data_args),
          needs_cuda=False, expect=(35, 10)),
    Entry("distributed", "distributed", "memgrad", "//bench:bench_dist", dist_args, needs_cuda=False,
          expect=(40, 20)),
    Entry("interop_write", "interop", "memgrad", "//examples:safetensors_interop",
          lambda ctx: ["write", f"{ctx.tmp}/mg.safetensors"], output="check", needs_cuda=False, expect=(2, 2)),
    Entry("interop_read", "interop", "pytorch_eager", "pytorch/read_safetensors.py",
          lambda ctx: [f"{ctx.tmp}/mg.safetensors", "--write-back", f"{ctx.tmp}/pt.safetensors"], output="check",
          needs_cuda=False, expect=(5, 5)),
    Entry("interop_check", "interop", "memgrad", "//examples:safetensors_interop",
          lambda ctx: ["check", f"{ctx.tmp}/pt.safetensors"] if ctx.torch else
          Skip("no PyTorch-written file to check (PyTorch is not installed)"), output="check", needs_cuda=False,
          expect=(2, 2)),
]
