#!/usr/bin/env python3
"""Probe for a warm start without Dynamo: the encoder and decode step as AOTInductor packages.

    python scripts/aoti_probe.py --device cuda --out /tmp/aoti   # on the GPU machine
    python scripts/aoti_probe.py --device cpu --no-encoder --out /tmp/aoti

Builds an engine of tiny.en's shapes on seeded random weights (scripts/gpu_tokens.py), exports
the encoder and the step's greedy and sampling variants with torch.export, every parameter and
buffer an input (the step mutates its caches and loop state in place, the caller's own
tensors), and compiles each with `torch._inductor.aoti_compile_and_package`. Then it loads the
packages with `torch._C._aoti.AOTIModelPackageLoader` (which imports neither Dynamo nor
Inductor), decodes 3 windows of noise with them, greedy and at the fallback temperatures, and
compares the tokens with the eager engine's. On CUDA it also captures CUDA graphs over them,
times loading the packages in fresh processes, and (without --no-aot-compile) times the
current `--compile` artifacts' load the same way. Writes OUT/report.json."""
import argparse, faulthandler, json, os, subprocess, sys, time
from dataclasses import replace
from pathlib import Path

faulthandler.enable()  # a crash in the package loader says where
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts")); sys.path.insert(0, str(ROOT / "src"))
import torch
from torch import nn
from gpu_tokens import TINY, random_checkpoint, noise_windows
from wtx.engine import Engine, EngineOptions
from wtx.options import DecodingOptions
from wtx.audio import N_FRAMES

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--device", default="cuda", help="cuda or cpu")
p.add_argument("--beam", type=int, default=5, help="beam size (and best_of)")
p.add_argument("--batch", type=int, default=4, help="windows per batch")
p.add_argument("--out", default="/tmp/aoti", help="folder for the packages and report.json")
p.add_argument("--export-only", action="store_true", help="stop after torch.export")
p.add_argument("--no-encoder", action="store_true", help="compile the step's variants only")
p.add_argument("--no-aot-compile", action="store_true", help="skip timing the current --compile artifacts")
args = p.parse_args()
out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
report = {"torch": torch.__version__}

class Stateless(nn.Module):
    """module's parameters and buffers as inputs (first), then call's own inputs."""
    def __init__(self, module, call):
        super().__init__()
        object.__setattr__(self, "module", module)  # not a submodule: its state comes in as inputs only
        self.call = call
        self.names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
    def state(self):
        d = dict(self.module.named_parameters()); d.update(self.module.named_buffers())
        return [d[n] for n in self.names]
    def forward(self, *tensors):
        n = len(self.names)
        return torch.func.functional_call(self.module, dict(zip(self.names, tensors[:n])), (), {} ) if self.call is None \
            else self.call(self.module, dict(zip(self.names, tensors[:n])), *tensors[n:])

def enc_call(encoder, state, mel):
    return torch.func.functional_call(encoder, state, (mel,))

ckpt = out / "random.pt"; random_checkpoint(TINY, ckpt)
dec = DecodingOptions(beam_size=args.beam, best_of=args.beam, sample_len=64)
opts = EngineOptions(model=str(ckpt), device=args.device, batch_size=args.batch, strict=True, cuda_graph=False,
                     condition_on_previous_text=False, decoding=dec,
                     **({"dtype": "fp32", "quantize": "none"} if args.device == "cpu" else {}))
engine = Engine(opts)
batch = engine.batch
windows = noise_windows()
temps = [None, [0.0, 0.6, 1.0]]
eager = [[list(map(int, r.tokens)) for r in engine.decode_batch(windows, temperatures=t)] for t in temps]
loop = batch.ensure_loop(); batch.owns_caches = True
mel = torch.zeros(batch.batch_size, batch.dims.n_mels, N_FRAMES, dtype=batch.dtype, device=batch.device)
funcs = {}
t0 = time.perf_counter()
with torch.no_grad():
    enc = Stateless(batch.model.encoder, enc_call)
    ep = torch.export.export(enc, tuple(enc.state()) + (mel,), strict=False)
    funcs["encoder"] = (enc, ep)
    for sample in (False, True):
        loop.sample = sample
        st = Stateless(loop, None)
        ep = torch.export.export(st, tuple(st.state()), strict=False)
        funcs[f"step-{'sample' if sample else 'greedy'}"] = (st, ep)
    loop.sample = False
report["export_s"] = round(time.perf_counter() - t0, 1)
print("exported in", report["export_s"], "s; step inputs", len(funcs["step-greedy"][0].names), flush=True)
if args.export_only:
    print(funcs["step-greedy"][1].graph_signature.user_inputs_to_mutate if hasattr(funcs["step-greedy"][1].graph_signature, "user_inputs_to_mutate") else "")
    sys.exit(0)
paths = {}
t0 = time.perf_counter()
for name, (_, ep) in funcs.items():
    if args.no_encoder and name == "encoder":
        continue
    t = time.perf_counter()
    paths[name] = torch._inductor.aoti_compile_and_package(ep, package_path=str(out / f"{name}.pt2"))
    report[f"aoti_compile_{name}_s"] = round(time.perf_counter() - t, 1)
    print(name, "compiled in", report[f"aoti_compile_{name}_s"], "s,", os.path.getsize(paths[name]), "bytes", flush=True)
# each package first in a fresh process, so a crash in the loader is reported rather than fatal here
probe = "import sys, torch; torch.zeros(1, device=sys.argv[2]); torch._C._aoti.AOTIModelPackageLoader(sys.argv[1], 'model', False, 1, -1); print('loaded')"
report["child_load"] = {}
for n, path in paths.items():
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", probe, path, args.device], capture_output=True, text=True)
    report["child_load"][n] = {"rc": r.returncode, "stdout": r.stdout[-200:], "stderr": r.stderr[-2000:]}
    print(n, "in a fresh process: rc", r.returncode, r.stdout.strip()[-100:], r.stderr.strip()[-1500:], flush=True)
(out / "report.json").write_text(json.dumps(report, indent=1))
loaders = {n: torch._C._aoti.AOTIModelPackageLoader(p, "model", False, 1, 0 if args.device == "cuda" else -1) for n, p in paths.items()}
report["constants"] = {n: l.get_constant_fqns() for n, l in loaders.items()}
print("constants", report["constants"])
enc_state = funcs["encoder"][0].state()
step_state = {s: funcs[f"step-{s}"][0].state() for s in ("greedy", "sample")}
if not args.no_encoder: batch.encoder = lambda m: loaders["encoder"].run(enc_state + [m])[0]
batch.step = lambda: loaders["step-sample" if loop.sample else "step-greedy"].run(step_state["sample" if loop.sample else "greedy"])
aoti = [[list(map(int, r.tokens)) for r in engine.decode_batch(windows, temperatures=t)] for t in temps]
report["aoti_equal_eager"] = [[a == b for a, b in zip(x, y)] for x, y in zip(aoti, eager)]
print("AOTI == eager per window:", report["aoti_equal_eager"], flush=True)
if args.device == "cuda":
    from wtx.compiled import CompiledRunner
    runner = CompiledRunner(batch, "inductor", True, True)
    t = time.perf_counter()
    runner._capture_cuda_graphs(batch.step); torch.cuda.synchronize()
    report["capture_s"] = round(time.perf_counter() - t, 2)
    graphs = [[list(map(int, r.tokens)) for r in engine.decode_batch(windows, temperatures=t)] for t in temps]
    report["aoti_graphs_equal_aoti"] = graphs == aoti
    print("AOTI graphs == AOTI:", graphs == aoti, "capture", report["capture_s"], "s", flush=True)
    loader_code = f"""
import time, sys
t0 = time.perf_counter()
import torch
t1 = time.perf_counter(); torch.zeros(1, device='cuda'); torch.cuda.synchronize(); t2 = time.perf_counter()
ls = [torch._C._aoti.AOTIModelPackageLoader(p, 'model', False, 1, 0) for p in {list(paths.values())!r}]
t3 = time.perf_counter()
import json
print(json.dumps({{'import_torch_s': t1 - t0, 'cuda_init_s': t2 - t1, 'load_packages_s': t3 - t2,
  'modules': {{m: m in sys.modules for m in ('torch._dynamo', 'torch._inductor', 'sympy', 'networkx', 'torch.distributed.fsdp')}}}}))
"""
    runs = [json.loads(subprocess.run([sys.executable, "-c", loader_code], capture_output=True, text=True).stdout) for _ in range(3)]
    report["fresh_load"] = runs
    print("fresh processes:", runs, flush=True)
if args.device == "cuda" and not args.no_aot_compile:
    # the current --compile path (torch.compile().aot_compile() and Inductor's cache bundle): the same engine, cold, then its load
    cache = out / "wtx-cache"
    os.environ["WTX_CACHE_DIR"] = str(cache)
    t = time.perf_counter()
    Engine(replace(opts, compile=True, cuda_graph=False))
    report["aot_compile_cold_s"] = round(time.perf_counter() - t, 1)
    print("aot_compile path cold", report["aot_compile_cold_s"], "s", flush=True)
    old_code = f"""
import time, sys, glob, os
t0 = time.perf_counter()
import torch
t1 = time.perf_counter(); torch.zeros(1, device='cuda'); torch.cuda.synchronize(); t2 = time.perf_counter()
sys.path.insert(0, 'src')
from wtx import compile_cache
compile_cache.configure()
t3 = time.perf_counter()
for b in glob.glob({str(cache)!r} + '/compiled/*.bin'):
    torch.compiler.load_cache_artifacts(open(b, 'rb').read())
t4 = time.perf_counter()
fs = [torch.compiler.load_compiled_function(open(f, 'rb')) for f in sorted(glob.glob({str(cache)!r} + '/compiled/*.fn'))]
t5 = time.perf_counter()
import json
print(json.dumps({{'import_torch_s': t1 - t0, 'cuda_init_s': t2 - t1, 'import_dynamo_inductor_s': t3 - t2, 'bundle_s': t4 - t3,
  'load_functions_s': t5 - t4, 'functions': len(fs)}}))
"""
    env = dict(os.environ, WTX_CACHE_DIR=str(cache))
    runs = []
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", old_code], capture_output=True, text=True, env=env)
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else r.stderr[-500:])
    report["fresh_load_aot_compile"] = runs
    print("fresh processes (aot_compile):", runs, flush=True)
(out / "report.json").write_text(json.dumps(report, indent=1))
