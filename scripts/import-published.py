#!/usr/bin/env python3
"""import-published.py MEASURED_RUNS_YAML > data/published/runs.yaml

Carries the published figures of a measured-runs file (the team's ../shared/calibration/
measured_runs.yaml) into ptdp's own format, data/published/runs.yaml: one row per run with its
source, the model in the keys of a model YAML, the layout in the keys of plan.yaml, and the step
time validate compares with. Every interpretation of a loosely written source field (the model
family from its name, SP and TP-overlap defaults of NeMo-era recipes, precision and optimizer
from free text) is made here once and written out explicitly, so the shipped file states what
the cost model is checked against. The rules are those of LoadMeasuredRuns
(cost_model/calibration_data.cc); tests/cost_model/calibration_data_test.cc checks that both
read the same rows when ../shared is present. Rows without a full layout are listed under
`not_carried` with the reason. Needs python3 with PyYAML (Debian: python3-yaml).
"""
import sys
import yaml


def family(name):
    low = name.lower()
    if "llama" in low:
        return dict(activation="swiglu", norm="rmsnorm", position_embedding="rope",
                    tied_embeddings=False, bias=False)
    if "nemotron" in low:
        return dict(activation="squared_relu", norm="layernorm", position_embedding="rope",
                    tied_embeddings=False, bias=False)
    return dict(activation="gelu", norm="layernorm", position_embedding="learned",
                tied_embeddings=True, bias=True)


def given(d, k):
    return d is not None and d.get(k) is not None


def convert(e):
    """Returns (row, None) or (None, why)."""
    model, hw, lay, meas = e.get("model"), e.get("hardware"), e.get("layout"), e.get("measured")
    if not (model and hw and lay and meas):
        return None, "missing model/hardware/layout/measured"
    for k in ("layers", "hidden", "heads", "seq", "vocab"):
        if not given(model, k):
            return None, "model.%s not given" % k
    for k in ("tp", "pp", "dp", "microbatch", "global_batch"):
        if not given(lay, k):
            return None, "layout.%s not given" % k
    fam = family(str(model.get("name", "")))
    if given(model, "ffn"):
        ffn = model["ffn"]
    elif fam["activation"] == "gelu":
        ffn = 4 * model["hidden"]
    else:
        return None, "model.ffn not given"
    m = dict(name=str(model.get("name", "")), layers=model["layers"], hidden=model["hidden"],
             heads=model["heads"],
             kv_heads=model["kv_heads"] if given(model, "kv_heads") else model["heads"],
             ffn_hidden=ffn, seq_len=model["seq"], vocab=model["vocab"], **fam)
    tp, pp, dp = lay["tp"], lay["pp"], lay["dp"]
    cp = lay["cp"] if given(lay, "cp") else 1
    vp = lay["vp"] if given(lay, "vp") else 1
    rc = str(lay.get("recompute") or "")
    prec = str(lay.get("precision") or "")
    opt = str(lay.get("optimizer_sharding") or "")
    ident = str(e.get("id", ""))
    l = dict(tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, micro_batch=lay["microbatch"],
             global_batch=lay["global_batch"],
             # SP unstated: NeMo enables it with TP in these recipes.
             sequence_parallel=bool(lay["sp"]) if given(lay, "sp") else tp > 1,
             recompute="full" if rc.startswith("full") else
                       "selective" if rc.startswith("selective") else "none",
             distributed_optimizer="distributed" in opt or "FSDP" in opt,
             precision="fp8" if ("fp8" in prec or "FP8" in prec) else "bf16",
             schedule="interleaved" if vp > 1 else "1f1b",
             overlap_grad_reduce=True,
             # Stated in the row's notes, or the NeMo-based recipes (dgxc, NeMo 24.07, Megatron-
             # Bridge), whose GPT/Llama/Nemotron configs all turn on TE's userbuffer overlap.
             tp_comm_overlap=("TP comm overlap" in str(lay.get("notes") or "")
                              or "dgxc_" in ident or "nemo2407" in ident
                              or "megatron_bridge" in ident))
    gpu = str(hw.get("gpu", ""))
    row = dict(id=ident, source="; ".join(str(e["source"][k]) for k in ("title", "location")
                                          if e.get("source", {}).get(k)),
               gpu=gpu, gpus=hw["total_gpus"], model=m, layout=l)
    published = {k: v for k, v in meas.items() if v is not None and not isinstance(v, (dict, list))}
    if given(meas, "per_layer_combined_ms"):
        row["layer_fwd_bwd_ms"] = meas["per_layer_combined_ms"]
    elif given(meas, "step_time_s"):
        row["step_time_s"] = meas["step_time_s"]
    elif e.get("derived") and given(e["derived"], "step_time_s"):
        row["step_time_s"] = e["derived"]["step_time_s"]
        row["step_time_derived"] = True
    else:
        return None, "no step time"
    row["published"] = published
    if tp * cp * pp * dp != row["gpus"]:
        return None, "tp*cp*pp*dp != total_gpus"
    return row, None


def scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def flow(d):
    return "{" + ", ".join("%s: %s" % (k, scalar(v)) for k, v in d.items()) + "}"


def main():
    src = yaml.safe_load(open(sys.argv[1]))
    rows, dropped = [], []
    for e in src["entries"]:
        row, why = convert(e)
        if row:
            rows.append(row)
        else:
            dropped.append((str(e.get("id", "")), why))
    out = sys.stdout
    out.write("""\
# Published, measured Megatron/NeMo training runs with their full layouts: what `ptdp validate`
# checks the cost model against (data/published/README.md). Each row names its source; the
# numbers are the sources' own (step_time_derived: the step time computed from the published
# tokens/s or TFLOP/s as global_batch * seq_len / (tokens/s/GPU * GPUs), not printed as such).
# Keys: model as in a model YAML (configs/models/), layout as in plan.yaml; published: the
# source's measured cells as printed (tokens/s per GPU, TFLOP/s per GPU, MFU %).
# Units: step_time_s seconds; layer_fwd_bwd_ms milliseconds (one layer's forward + backward).
ptdp_published_runs_version: 1
runs:
""")
    for r in rows:
        out.write("- id: %s\n" % scalar(r["id"]))
        out.write("  source: %s\n" % scalar(r["source"]))
        out.write("  gpu: %s\n  gpus: %d\n" % (scalar(r["gpu"]), r["gpus"]))
        out.write("  model: %s\n" % flow(r["model"]))
        out.write("  layout: %s\n" % flow(r["layout"]))
        for k in ("step_time_s", "step_time_derived", "layer_fwd_bwd_ms"):
            if k in r:
                out.write("  %s: %s\n" % (k, scalar(r[k])))
        out.write("  published: %s\n" % flow(r["published"]))
    out.write("# Rows of the source without a full layout or a time, not carried:\n")
    out.write("not_carried:\n")
    for ident, why in dropped:
        out.write("- {id: %s, why: %s}\n" % (scalar(ident), scalar(why)))


if __name__ == "__main__":
    main()
