#!/usr/bin/env python3
"""Runs an `--emit megatron` script through Megatron-LM's own argument checks.

    ptdp plan ... --emit megatron > run.sh
    scripts/megatron-check.py run.sh            (or: ... | scripts/megatron-check.py -)

Builds Megatron-LM's parser (megatron/training/arguments.py: add_megatron_arguments), parses the
flags after pretrain_gpt.py, then runs validate_args with the world torchrun starts
(nproc_per_node x nnodes) and core_transformer_config_from_args (TransformerConfig.__post_init__),
with the environment the script exports. Placeholders get sample values (LR 3e-4 ...). torch,
Transformer Engine and the other GPU libraries are stand-ins that import and answer "absent", the
GPU reads as a Hopper (compute capability 9.0), so the checks that need real tensors or devices
are not run; every check on the arguments themselves is.

Needs Python >= 3.12 (Megatron-LM imports typing.override) and a Megatron-LM git repository
(default: the mirror /work/.mirror/NVIDIA+Megatron-LM/repo, at HEAD), whose megatron/ folder is
extracted once into a cache folder. The tests do not need it: tests/cli/megatron_command_test.cc
checks the flag names against tests/data/megatron_flags.txt (scripts/megatron-flags.py).
Exit status 0 when every check passes; 1 with Megatron's message otherwise.
"""
import argparse
import importlib.abc
import importlib.machinery
import os
import re
import shlex
import subprocess
import sys
import tempfile
import types
import typing

DEFAULT_REPO = "/work/.mirror/NVIDIA+Megatron-LM/repo"
# Libraries replaced by stand-ins; any other import must be installed or part of megatron/.
STANDINS = ("torch", "transformer_engine", "apex", "triton", "numpy", "einops", "flash_attn",
            "nvidia_resiliency_ext", "tensorstore", "zarr", "wandb", "tqdm", "safetensors", "yaml",
            "regex", "tiktoken", "sentencepiece", "transformers", "datasets", "pynvml")
SAMPLES = {"LR": "3e-4", "MIN_LR": "3e-5", "LR_WARMUP_ITERS": "10", "TRAIN_ITERS": "100",
           "NODE_RANK": "0"}


def _hidden(name):
    return name.startswith("__") or name.startswith("_abc") or name.startswith("_is_") or \
        name in ("_fields", "_field_defaults")


class _Meta(type(typing.Protocol)):
    """Stand-in classes: any attribute is another stand-in class; used as a decorator they return
    what they decorate; they subclass, subscript and compare (as False)."""

    def __getattr__(cls, name):
        if _hidden(name):
            raise AttributeError(name)
        return _standin(name)

    def __getitem__(cls, key):
        return cls

    def __call__(cls, *a, **k):
        if len(a) == 1 and not k and callable(a[0]) and not isinstance(a[0], _Standin):
            return a[0]
        return type.__call__(cls)

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0

    def __lt__(cls, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__


class _Standin(metaclass=_Meta):
    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        if _hidden(name):
            raise AttributeError(name)
        return _standin(name)()

    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and not k and callable(a[0]) else _Standin()

    def __getitem__(self, key):
        return _Standin()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def __int__(self):
        return 0

    def __float__(self):
        return 0.0

    def __index__(self):
        return 0


def _standin(name):
    return _Meta(str(name), (_Standin,), {})


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if _hidden(name):
            raise AttributeError(name)
        value = _standin(name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in STANDINS:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__, m.__version__, m.__file__ = [], "99.0.0", "<stand-in " + spec.name + ">"
        return m

    def exec_module(self, module):
        pass


class _Version:
    """packaging.version.Version, enough for Megatron's version checks (when not installed)."""

    def __init__(self, s):
        self.t = tuple(int(x) for x in re.findall(r"\d+", str(s)))

    def __lt__(self, o): return self.t < o.t
    def __le__(self, o): return self.t <= o.t
    def __gt__(self, o): return self.t > o.t
    def __ge__(self, o): return self.t >= o.t
    def __eq__(self, o): return self.t == o.t

    @property
    def major(self): return self.t[0] if self.t else 0

    @property
    def minor(self): return self.t[1] if len(self.t) > 1 else 0


def install_standins():
    try:
        import packaging.version  # noqa: F401
    except ImportError:
        pk, pv = types.ModuleType("packaging"), types.ModuleType("packaging.version")
        pv.Version = pv.parse = _Version
        pv.InvalidVersion = ValueError
        pk.version = pv
        sys.modules["packaging"], sys.modules["packaging.version"] = pk, pv
    sys.modules.setdefault("typing_extensions", typing)
    sys.meta_path.insert(0, _Finder())


def megatron_source(repo, rev):
    commit = subprocess.run(["git", "-C", repo, "rev-parse", rev], check=True, capture_output=True,
                            text=True).stdout.strip()
    root = os.path.join(tempfile.gettempdir(), "ptdp-megatron-" + commit[:12])
    if not os.path.isdir(os.path.join(root, "megatron")):
        os.makedirs(root, exist_ok=True)
        archive = subprocess.run(["git", "-C", repo, "archive", commit, "megatron"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "x", "-C", root], input=archive, check=True)
    return root, commit


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("script", help="the --emit megatron output (a file, or - for stdin)")
    p.add_argument("--repo", default=DEFAULT_REPO, help="Megatron-LM git directory")
    p.add_argument("--rev", default="HEAD")
    a = p.parse_args()
    if sys.version_info < (3, 12):
        sys.exit("megatron-check: needs Python >= 3.12 (Megatron-LM imports typing.override)")
    text = sys.stdin.read() if a.script == "-" else open(a.script).read()
    lines = [l for l in text.split("\n") if l.strip()]
    start = next((i for i, l in enumerate(lines) if l.startswith("torchrun ")), None)
    if start is None:
        sys.exit("megatron-check: no torchrun line in " + a.script)
    cmd = " ".join(l.rstrip("\\") for l in lines[start:])
    for line in lines[:start]:  # the environment the script sets
        if m := re.match(r"export (\w+)=(\S+)", line):
            os.environ[m.group(1)] = m.group(2)
        elif m := re.match(r"unset (\w+)", line):
            os.environ.pop(m.group(1), None)
    cmd = re.sub(r"\$\{([A-Z_]+)(:-([^}]*))?\}",
                 lambda m: SAMPLES.get(m.group(1), m.group(3) or "PLACEHOLDER"), cmd)
    tokens = shlex.split(cmd)
    launcher, flags = tokens[:tokens.index("pretrain_gpt.py")], tokens[tokens.index("pretrain_gpt.py") + 1:]
    grid = {k: int(v) for k, v in re.findall(r"--(nproc_per_node|nnodes)=(\d+)", " ".join(launcher))}
    world = grid.get("nproc_per_node", 1) * grid.get("nnodes", 1)

    root, commit = megatron_source(a.repo, a.rev)
    install_standins()
    sys.path.insert(0, root)
    import warnings
    warnings.simplefilter("ignore")
    from megatron.training import arguments
    import torch
    torch.cuda.get_device_capability = lambda *x: (9, 0)
    arguments.get_device_arch_version = lambda: 9
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    args = parser.parse_args(flags)  # exits 2 with argparse's message on a bad flag or value
    os.environ["WORLD_SIZE"], os.environ["RANK"] = str(world), "0"
    args.world_size, args.rank = world, 0
    import contextlib
    import logging
    logging.disable(logging.CRITICAL)
    try:  # validate_args prints every argument, the layout parser logs the stages
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), \
                contextlib.redirect_stderr(devnull):
            args = arguments.validate_args(args, {})
            config = arguments.core_transformer_config_from_args(args)
    except (AssertionError, ValueError, RuntimeError, NotImplementedError) as e:
        print(f"megatron-check: Megatron-LM {commit[:7]} refuses it: {type(e).__name__}: {e}")
        sys.exit(1)
    print(f"megatron-check: ok with Megatron-LM {commit[:7]}: {len(flags)} arguments, world {world} "
          f"(tp {args.tensor_model_parallel_size} pp {args.pipeline_model_parallel_size} "
          f"cp {args.context_parallel_size} dp {args.data_parallel_size} "
          f"ep {args.expert_model_parallel_size} etp {args.expert_tensor_parallel_size} "
          f"vp {args.virtual_pipeline_model_parallel_size}), {type(config).__name__}")


if __name__ == "__main__":
    main()
