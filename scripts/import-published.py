#!/usr/bin/env python3
"""import-published.py MEASURED_RUNS_YAML > data/published/runs.yaml
   import-published.py --recipes MEGATRON_RECIPES_RUNS_YAML data/published/runs.yaml \
       > data/published/megatron_recipes.yaml

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

--recipes carries the dense H100 and Blackwell (B200, GB200 and GB300 NVL72) rows of the
team's ../shared/calibration/megatron_recipes/runs.yaml (Megatron-Bridge performance summaries,
dgxc-benchmarking tags, NeMo long-sequence tables) the same way (convert_recipe states each
interpretation), context-parallel and uneven-pipeline rows included (Llama 3.1 405B with the
embedding and loss counted in the split, as its recipe sets); its MoE and hybrid (Mamba) rows
are carried by --moe. A row that runs.yaml (the second argument) already has is left out as a
duplicate.

--moe MEGATRON_RECIPES_RUNS_YAML > data/published/megatron_moe.yaml carries its Mixture-of-Experts
rows (DeepSeek-V3, Grok-1, Llama 4, Mixtral) on H100 and Blackwell: the model from the row and
its model_registry entry (experts, top-k, shared experts, dense-first layers and MoE layer step,
router, MLA, MTP), the routing policy from the row's label (force-balanced, dropless, or the
capacity factor of a token-dropping recipe), expert parallelism (an unstated etp is Megatron's
default, tp) and the pipeline split (the first/last-stage counts a row's notes derive from its
recipe's code, or, where the table gives only "61 layers over S stages", Megatron-Bridge's
balanced layout string: the embedding's and the loss's stages one layer lighter, the MTP layer
with the loss). Hybrid Mamba-MoE rows (Nemotron 3) are carried where the registry gives their
layer pattern and Mamba sizes (Nano): the pattern as hybrid_pattern, squared-ReLU experts, sigmoid
router, no position embedding; Nemotron 3 Super's dimensions, which the registry leaves out, come
from its published config (ARCH_SUPPLEMENT: LatentMoE, two repeated "*E" MTP depths). A recompute that names modules ('selective: mla_up_proj', a list)
is Megatron's --recompute-modules (recompute_modules).
"""
import re
import sys
import yaml


def family(name):
    # Llama and Nemotron-4 train without dropout (NeMo 2's LlamaConfig / NemotronConfig,
    # Megatron-Bridge's LlamaBridge, the NeMo launcher's nemotron configs); GPT keeps 0.1
    # (the NeMo launcher's gpt3/175b.yaml). SetFamily in cost_model/calibration_data.cc.
    low = name.lower()
    if "llama" in low:
        return dict(activation="swiglu", norm="rmsnorm", position_embedding="rope",
                    tied_embeddings=False, bias=False, dropout=False)
    if "nemotron" in low:
        return dict(activation="squared_relu", norm="layernorm", position_embedding="rope",
                    tied_embeddings=False, bias=False, dropout=False)
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
             # Unstated in a NeMo-based recipe row (NeMo 24.07, dgxc, Megatron-Bridge): their
             # performance recipes run distributed_fused_adam (NeMo-Framework-Launcher's GPT-3,
             # Llama and Nemotron configs) or Megatron-Bridge's use_distributed_optimizer, as the
             # rows that state it say; "DDP (distributed optimizer not stated)" is that default.
             # FSDP shards the optimizer too. (Korthikanti's layers: no optimizer in the time.)
             distributed_optimizer="distributed" in opt or "FSDP" in opt
                                   or (not opt and ("nemo2407" in ident or "megatron_bridge" in ident
                                                    or "dgxc_" in ident)),
             precision="fp8" if ("fp8" in prec or "FP8" in prec) else "bf16",
             schedule="interleaved" if vp > 1 else "1f1b",
             overlap_grad_reduce=True,
             # Stated in the row's notes, or the NeMo-based recipes (dgxc, NeMo 24.07, Megatron-
             # Bridge), whose GPT/Llama/Nemotron configs all turn on TE's userbuffer overlap.
             # Megatron asserts it needs SP (tp 1 turns SP off, and the recipes the overlap).
             tp_comm_overlap=("TP comm overlap" in str(lay.get("notes") or "")
                              or "dgxc_" in ident or "nemo2407" in ident
                              or "megatron_bridge" in ident)
                             and (bool(lay["sp"]) if given(lay, "sp") else tp > 1))
    # Megatron-Bridge's performance recipes keep the gradient buffers in bf16 (as for the
    # megatron_recipes rows below; LoadMeasuredRuns does the same).
    if "megatron_bridge" in ident:
        l["grad_reduce_in_bf16"] = True
        mb_cross_entropy(e, l)
        # Its Llama 3.1 405B recipe counts the embedding and the loss as a layer's slot each
        # (recipes/llama/llama3.py llama31_405b_pretrain_config: 126 + 2 over pp x vp).
        if "405b" in str(model.get("name", "")).lower():
            l.update(embedding_in_split=True, loss_in_split=True)
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


# Rows whose printed layout is not the one that ran, with the evidence. Megatron-Bridge's
# 26.02.01 archive table prints its GB300 Llama 3 70B MXFP8 row as tp1 pp4 mbs2 without vp and
# its NVFP4 row as tp1 pp1 mbs2 with FSDP 0, while its recipes of the time
# (scripts/performance/configs/llama/llama3_workload_base_configs.py at aa10ef7f1, 2026-02-10:
# LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_MX_V2 and _NVFP4_V2) run both at pp4 vp5 mbs1, as every
# other release's table prints them; as printed, 70B at pp1 without FSDP cannot hold its bf16
# weights and gradients (282 GB) and its activations on a 288 GB GB300, nor pp4 mbs2 its 1F1B
# activations (ptdp: 392 GiB).
LAYOUT_ERRATA = {
    "mb_260201_gb300_mxfp8_llama3_70b_64gpu": "the 26.02.01 table's layout (tp1 pp4 mbs2, no vp) "
        "is not its recipe's (pp4 vp5 mbs1, llama3_workload_base_configs.py at aa10ef7f1) and "
        "cannot fit a GB300",
    "mb_260201_gb300_nvfp4_llama3_70b_64gpu": "the 26.02.01 table's layout (tp1 pp1 mbs2, FSDP 0) "
        "is not its recipe's (pp4 vp5 mbs1, llama3_workload_base_configs.py at aa10ef7f1) and "
        "cannot fit a GB300",
}


def mb_precision_aware_optimizer(e, l, deepseek=False):
    """Megatron-Bridge's performance scripts turn on --use-precision-aware-optimizer for every
    bf16 run (scripts/performance/utils/helpers.py, then overrides.py set_post_overrides:
    compute_dtype bf16 and adam; since 568b3a3ef, 2025-08-28), its dtypes left fp32; the
    DeepSeek-V3 recipe sets it for every precision with bf16 moments and main gradients
    (recipes/deepseek/deepseek_v3.py since c0f24cf69, 2025-08-19; v0.6.0's
    deepseek_v3_pretrain_1024gpu_h100_bf16_config, which the perf recipes build on). Both turn
    it off under Megatron-FSDP (apply FSDP overrides: "cannot work with FSDP together")."""
    if not str(e["id"]).startswith("mb_") or l.get("shard_gradients"):
        return
    if deepseek:
        l.update(use_precision_aware_optimizer=True, exp_avg_dtype="bf16",
                 exp_avg_sq_dtype="bf16", main_grads_dtype="bf16")
    elif l["precision"] == "bf16":
        l["use_precision_aware_optimizer"] = True


def mb_cross_entropy(e, l):
    """Megatron-Bridge's performance recipes compute the loss with Transformer Engine's kernel:
    cross_entropy_loss_fusion on (GPTModelProvider's default) and cross_entropy_fusion_impl "te"
    (25.09's scripts/performance/configs/*_llm_pretrain.yaml, later utils/overrides.py and
    perf_recipes/_common.py _benchmark_common; DeepSeek-V4 and GLM-5, not rows here, take
    native). Their rows: mb_* here, megatron_bridge_* in the measured-runs file."""
    if str(e["id"]).startswith("mb_") or "megatron_bridge" in str(e["id"]):
        l["cross_entropy_fusion"] = "te"


def convert_recipe(e):
    """A dense H100 row of megatron_recipes/runs.yaml: (row, None) or (None, why)."""
    if str(e.get("id")) in LAYOUT_ERRATA:
        return None, LAYOUT_ERRATA[str(e["id"])]
    model, hw, lay, meas = e["model"], e["hardware"], e["layout"], e.get("measured") or {}
    derived, flags = e.get("derived") or {}, e.get("flags") or {}
    split = {}
    if flags.get("uneven_pp"):
        # The split the row's notes name from its recipe (Megatron-Bridge llama31_405b:
        # account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split).
        notes = " ".join(str(n) for n in (e.get("notes") or []))
        if ("account_for_embedding_in_pipeline_split=True" in notes
                and "account_for_loss_in_pipeline_split=True" in notes):
            split = dict(embedding_in_split=True, loss_in_split=True)
        else:
            return None, "uneven pipeline split (%s) without the recipe's split flags" % (
                lay.get("pp_layout") or "per notes")
    if "SFT" in str(e["source"].get("table", "")):
        return None, "fine-tuning (SFT) row: its data packing is not in the row"
    if not given(lay, "microbatch"):
        return None, "layout.microbatch not given"
    if not given(lay, "precision"):
        return None, "precision not given (%s)" % (lay.get("precision_note") or "")
    if given(meas, "step_time_s"):
        step, step_derived = meas["step_time_s"], False
    elif given(derived, "step_time_s"):  # from the published tokens/s
        step, step_derived = derived["step_time_s"], True
    else:
        return None, "no step time or tokens/s (TFLOP/s are counted differently per source)"
    fam = family(str(model.get("family", "")) + " " + str(model.get("name", "")))
    # A proxy run (dgxc's 405B on 32-192 GPUs) trains the first `layers_run` layers only: that
    # is the model that ran, and its name says so.
    layers = model.get("layers_run") or model["layers"]
    name = str(model["name"]) + (" (%d-layer proxy)" % layers if layers != model["layers"] else "")
    m = dict(name=name, layers=layers, hidden=model["hidden"],
             heads=model["heads"], kv_heads=model.get("kv_heads") or model["heads"],
             ffn_hidden=model["ffn_dense"], seq_len=lay.get("seq") or model["seq"],
             vocab=model["vocab"], **fam)
    tp, pp = lay["tp"], lay["pp"]
    cp = lay.get("cp") or 1
    vp = lay.get("vp") or 1
    gpus = hw["total_gpus"]
    if gpus % (tp * pp * cp) != 0:
        return None, "total_gpus not a multiple of tp*pp*cp"
    dp = gpus // (tp * pp * cp)
    if given(derived, "dp") and derived["dp"] != dp:
        return None, "derived dp %s != total_gpus / (tp*pp*cp) = %d" % (derived["dp"], dp)
    rc = str(lay.get("recompute") or "none")
    prec = str(lay["precision"])
    opt = str(lay.get("distributed_optimizer") or "")
    mbs = lay["microbatch"]
    # A table's alternate (parenthesised) configuration shares the row's MBS cell; where its
    # own GA contradicts that MBS, the GA's is the alternate's: GBS / (DP x GA) (Megatron-Bridge
    # 25.09's GB200 Llama 3 70B: FSDP 64 (0), tp 1 (2), pp 1 (4), vp 1 (5), GA 1 (16) at GBS
    # 128 and MBS 2: the tp2 pp4 vp5 alternate trains micro-batches of 1, as its recipe does).
    ga = lay.get("ga")
    if ("parenthesised" in str(e["source"].get("value_variant", "")) and ga
            and ga * mbs * dp != lay["global_batch"] and lay["global_batch"] % (ga * dp) == 0):
        mbs = lay["global_batch"] // (ga * dp)
    l = dict(tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, micro_batch=mbs,
             global_batch=lay["global_batch"],
             # SP unstated: Megatron-Bridge and NeMo turn it on with TP.
             sequence_parallel=bool(lay["sp"]) if given(lay, "sp") else tp > 1,
             # Unstated: the performance recipes run without recompute (the rows that state it
             # say "none"); a recompute would show in the published recipe settings.
             recompute="full" if rc.startswith("full") else
                       "selective" if rc.startswith("selective") else "none",
             # distributed_fused_adam (NeMo) and Megatron-Bridge's use_distributed_optimizer are
             # the distributed optimizer; unstated, the recipes' default is the same. FSDP is
             # taken as the distributed optimizer too (as for runs.yaml).
             distributed_optimizer=True if not opt or "distributed" in opt else "fsdp" in opt.lower(),
             # NVFP4 (Blackwell) is fp4; FP8 in any scaling (delayed, current, MXFP8 blocks) fp8.
             precision="fp4" if "FP4" in prec.upper() else "fp8" if "FP8" in prec.upper() else "bf16",
             schedule="interleaved" if vp > 1 else "1f1b",
             overlap_grad_reduce=True,
             # TE's userbuffer TP overlap is on in every NeMo / Megatron-Bridge Llama recipe.
             tp_comm_overlap=tp > 1, **split)
    # An FSDP column > 0 (the Megatron-FSDP sharding group): Megatron-Bridge's perf recipes run
    # use_megatron_fsdp with data_parallel_sharding_strategy "optim_grads_params" (ZeRO-3:
    # perf_recipes/llama/{b200,b300,gb200,gb300}/llama3*.py).
    if (lay.get("fsdp") or 0) > 0:
        l.update(distributed_optimizer=True, shard_gradients=True, shard_params=True)
        # The same recipes offload activations to the Grace's memory: the FP8 (current
        # scaling) Llama 3 70B ones cpu_offloading_num_layers 40 on GB200, 20 on GB300 (the
        # recipes' values at the collection's Megatron-Bridge commit; earlier releases' are not
        # in the source).
        offload = {"GB200": 40, "GB300": 20}.get(str(hw["gpu"]).split()[0])
        if offload and l["precision"] == "fp8" and "70B" in str(model.get("name", "")):
            l["cpu_offloading_num_layers"] = offload
    # Megatron-Bridge's performance recipes reduce gradients in bf16 (perf_recipes/_common.py
    # _perf_precision and scripts/performance's get_precision_config: grad_reduce_in_fp32
    # False); Megatron-FSDP keeps them in the weights' dtype anyway.
    if str(e["id"]).startswith("mb_") and not l.get("shard_gradients") and l["precision"] != "fp32":
        l["grad_reduce_in_bf16"] = True
    mb_precision_aware_optimizer(e, l)
    mb_cross_entropy(e, l)
    # Megatron-Bridge's Llama 3 and 3.1 configs turn TE's TP overlap off for NVFP4 from the 26.02
    # container on (scripts/performance/configs/llama/llama3*_llm_pretrain.py, v0.3.0 to
    # v0.5.1: tp_comm_overlap = False if precision == "nvfp4"; every GPU's function).
    release = mb_release(e)
    if (release and release >= (26, 2, 0) and l["precision"] == "fp4"
            and "llama" in str(model.get("name", "")).lower()):
        l["tp_comm_overlap"] = False
    src = e["source"]
    # The source is the document and its release (one table per model and precision in it):
    # rows of one source share it, for validate's per-source figures; the table and column
    # the row was read from go to `table`.
    row = dict(id=str(e["id"]), source="%s; %s" % (src["title"], src.get("release", "")),
               table="; ".join(str(src[k]) for k in ("table", "path") if src.get(k)),
               gpu=str(hw["gpu"]),
               gpus=gpus, model=m, layout=l, step_time_s=step, step_time_derived=step_derived,
               published={k: v for k, v in meas.items()
                          if v is not None and not isinstance(v, (dict, list))})
    return row, None


MOE_FAMILIES = ("deepseek-v3", "grok-1", "llama4", "mixtral")

# Architectures the source's registry names without dimensions ("arch_source: name only"),
# read here from their published configs. Nemotron 3 Super: the Hugging Face config.json of
# nvidia/NVIDIA-Nemotron-3-Super-120B-A12B (hybrid_override_pattern, mamba_num_heads 128,
# mamba_head_dim 64, n_groups 8, ssm_state_size 128, 32 heads / 2 KV heads of 128, 512 routed
# experts top-22 of 2688 on moe_latent_size 1024, one shared expert of 5376, vocab 131072,
# mtp_hybrid_override_pattern "*E"); its Megatron-Bridge recipes (recipes/nemotronh/h100/
# nemotron_3_super.py, which the perf recipes start from) train mtp_num_layers 2 with
# mtp_use_repeated_layer.
ARCH_SUPPLEMENT = {
    "nemotron_3_super": dict(
        layers=88, hidden=4096, heads=32, kv_heads=2, head_dim=128, vocab=131072,
        hybrid=dict(pattern="MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*"
                            "EMEMEMEMEM*EMEMEMEM*EMEMEMEME",
                    mamba_state_dim=128, mamba_num_heads=128, mamba_head_dim=64,
                    mamba_num_groups=8, mtp_pattern="*E", mtp_depths=2, mtp_repeated=True),
        moe_cfg=dict(num_experts=512, topk=22, expert_ffn=2688, shared_experts=1,
                     shared_expert_ffn=5376, latent_size=1024),
        arch_source="HF config.json of nvidia/NVIDIA-Nemotron-3-Super-120B-A12B"),
}


def moe_model(e, reg):
    """The model keys of a MoE row, or (None, why)."""
    model, lay = e["model"], e["layout"]
    fam = model.get("family")
    r = dict(reg.get(model.get("key"), {}))
    r.update({k: v for k, v in model.items() if v is not None})
    r.update(ARCH_SUPPLEMENT.get(model.get("key"), {}))
    cfg = r.get("moe_cfg") or {}
    hyb = r.get("hybrid") or {}
    if (r.get("hybrid_layer_counts") or fam == "nemotron-3") and not hyb.get("pattern"):
        return None, ("hybrid Mamba-MoE model (%s): its layer pattern and Mamba sizes are not in "
                      "the source (%s)" % (fam, r.get("arch_source", "no arch_source")))
    if hyb and r.get("vocab") is None:
        # The registry leaves it out; the Nemotron-H / Nemotron 3 tokenizer's 131,072 entries
        # (the HF config.json of nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B: vocab_size 131072).
        r["vocab"] = 131072
    for k in ("layers", "hidden", "heads", "vocab"):
        if r.get(k) is None:
            return None, "model.%s not given" % k
    layers = r.get("layers_run") or r["layers"]
    name = str(r["name"]) + (" (%d-layer proxy)" % layers if layers != r["layers"] else "")
    m = dict(name=name, layers=layers, hidden=r["hidden"], heads=r["heads"],
             kv_heads=r.get("kv_heads") or r["heads"],
             ffn_hidden=r.get("ffn_dense") or cfg["expert_ffn"],
             seq_len=lay.get("seq") or r["seq"], vocab=r["vocab"],
             activation="geglu" if "geglu" in str(r.get("activation", "")) else "swiglu",
             norm="rmsnorm", position_embedding="rope",
             tied_embeddings=fam == "grok-1",  # Grok-1's InOutEmbed decodes with the embedding
             bias=False, dropout=False)
    if r.get("head_dim") and r["head_dim"] != r["hidden"] // r["heads"]:
        m["kv_channels"] = r["head_dim"]
    if hyb:
        # A hybrid (Megatron-Core hybrid stack) Nemotron: its pattern (M Mamba-2, * attention,
        # E MoE), the Mamba sizes of the registry (groups: Megatron's default 8, as
        # Nemotron3NanoProvider leaves it), squared-ReLU experts, no position embedding
        # (Megatron-LM's Nemotron-3 Nano example: --position-embedding-type none --squared-relu).
        m.update(layers=len(hyb["pattern"]), activation="squared_relu",
                 position_embedding="none")
        m["hybrid_pattern"] = hyb["pattern"] + ("/" + hyb.get("mtp_pattern", "")) * hyb.get("mtp_depths", 0)
        if hyb.get("mtp_repeated"):
            m["mtp_repeated_layer"] = True
        m.update(mamba_state_dim=hyb["mamba_state_dim"], mamba_head_dim=hyb["mamba_head_dim"],
                 mamba_num_groups=hyb.get("mamba_num_groups", 8),
                 mamba_num_heads=hyb["mamba_num_heads"])
    m.update(num_experts=cfg["num_experts"], moe_topk=cfg["topk"], moe_ffn_hidden=cfg["expert_ffn"])
    if cfg.get("shared_experts"):
        m["moe_shared_ffn_hidden"] = cfg["shared_experts"] * cfg["shared_expert_ffn"]
    if cfg.get("latent_size"):
        m["moe_latent_size"] = cfg["latent_size"]
    freq = str(cfg.get("moe_layer_freq") or "")
    if cfg.get("dense_layers_first"):
        m["moe_dense_layers_first"] = cfg["dense_layers_first"]
    if freq.startswith("[0,1]"):
        m["moe_layer_step"] = 2  # '[0,1]*24': layers 1, 3, 5, ... are MoE
    elif freq and not freq.startswith("1") and not freq.startswith("[0]*"):
        return None, "MoE layer pattern %r not understood" % freq
    m["moe_router"] = "sigmoid" if ("sigmoid" in str(cfg.get("router", ""))
                                    or fam in ("llama4", "nemotron-3")) else "softmax"
    policy = str(lay.get("moe_token_policy") or "")
    notes = " ".join(str(n) for n in (e.get("notes") or []))
    if cfg.get("capacity_factor") or "capacity_factor" in notes:
        m["moe_routing"], m["moe_capacity_factor"] = "capacity", float(cfg.get("capacity_factor") or 1.0)
    elif "token-drop" in policy.lower() or "tokendrop" in policy.lower():
        # Megatron-Bridge's "(tokendrop)" rows: apply_moe_token_drop's defaults
        # (training/utils/moe_token_drop.py): moe_expert_capacity_factor 1.0 and
        # moe_pad_expert_input_to_capacity, every expert computes its capacity.
        m["moe_routing"], m["moe_capacity_factor"] = "capacity", 1.0
    elif "force" in policy.lower() or "balanced" in policy.lower():
        m["moe_routing"] = "balanced"
    else:
        m["moe_routing"] = "dropless"
    mla = r.get("mla")
    if mla:
        m.update(q_lora_rank=mla["q_lora_rank"], kv_lora_rank=mla["kv_lora_rank"],
                 qk_head_dim=mla["qk_head_dim"], qk_pos_head_dim=mla["qk_pos_emb_head_dim"],
                 v_head_dim=mla["v_head_dim"])
    if r.get("mtp_layers") and layers == r["layers"]:
        m["mtp_layers"] = r["mtp_layers"]
    return m, None


def balanced_layout(layers, stages, mtp):
    """Megatron-Bridge's style of layout string for `layers` over `stages` virtual stages: the
    embedding's first stage and the loss's last stage one layer lighter ("Et|(tt|)*30mL" for 61
    over 32), or None when no such split exists."""
    c = -(-(layers + 2) // stages)
    first, last = c - 1, layers - (c - 1) - (stages - 2) * c
    if stages < 2 or first < 0 or last < 0 or last > c:
        return None
    mid = "(%s|)*%d" % ("t" * c, stages - 2) if stages > 2 else ""
    return "E%s|%s%s%sL" % ("t" * first, mid, "t" * last, "m" * mtp)


RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "mlp", "moe", "moe_act",
                     "shared_experts")


def recompute_of(rc):
    """(recompute, recompute_modules or None) of a row's recompute field, or (None, why): a list
    or 'selective: a, b (...)' names Megatron's --recompute-modules (MLA's 'up_proj' is
    mla_up_proj); 'full...' is full recompute; nothing, [] or 'none...' is none."""
    if rc is None or rc == [] or str(rc).startswith("none"):
        return "none", None
    if isinstance(rc, list):
        names = [str(n) for n in rc]
    elif str(rc).startswith("full"):
        return "full", None
    elif str(rc).startswith("selective"):
        text = str(rc).split(":", 1)[1] if ":" in str(rc) else "core_attn"
        text = re.sub(r"\([^)]*\)", "", text)  # '(launch.sh RM, v25.05.x)': a note
        names = [n.strip().split(" ")[0] for n in text.split(",")]
        names = ["mla_up_proj" if n == "up_proj" else n for n in names if n]
    else:
        return None, "recompute %r not understood" % rc
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown:
        return None, "recompute modules %s: %s not modelled" % (names, unknown)
    return "selective", ",".join(n for n in RECOMPUTE_MODULES if n in names)


# Megatron-Bridge containers from which a DeepSeek-V3 MXFP8 config sets moe_a2a_overlap=True
# (scripts/performance/configs/deepseek/deepseek_workload_base_configs.py; the container's
# release by the row's layout): B200 from v0.4.2 (26.04.01: DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2,
# pp8 vp2 ep32, recompute mla_up_proj and mlp, as the 26.04.01 row ran), GB200 and GB300 from
# v0.5.0 (26.06: *_GB200_FP8_MX_V1 and *_GB300_FP8_MX_V1, the latter mbs 1 without recompute, as
# the 26.06 row ran; v0.6.0's perf_recipes keep it, _enable_deepseek_full_iteration_mxfp8), B300
# from v0.5.1 (26.06.01). Earlier containers and the other precisions: False.
DEEPSEEK_A2A_OVERLAP_FROM = {"B200": (26, 4, 1), "GB200": (26, 6, 0), "GB300": (26, 6, 0),
                             "B300": (26, 6, 1)}


def gpu_kind(hw):
    """'H100', 'B200', 'GB200', ... of a row's hardware.gpu ('H100-SXM5-80GB', 'GB200 (NVL72)')."""
    return str(hw["gpu"]).split()[0].split("-")[0]


def mb_release(e):
    """(yy, mm, patch) of a Megatron-Bridge row's container from its id, or None."""
    m = re.match(r"mb_(\d\d)(\d\d)(\d\d)?_", str(e["id"]))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def deepseek_a2a_overlap(e, hw, prec):
    release = mb_release(e)
    first = DEEPSEEK_A2A_OVERLAP_FROM.get(gpu_kind(hw))
    if not release or not first or "MX" not in prec:
        return False
    return release >= first


# The recompute modules of the Megatron-Bridge DeepSeek-V3 presets, by container and GPU, for the
# rows whose table leaves recompute out (25.09, 25.11, 26.08; the later tables state it). Every
# preset sets recompute_granularity "selective" and a module list per GPU, whatever the
# precision:
#   25.09 (v0.1.0rc4, scripts/performance/run_script.py): B200 mla_up_proj; GB200 mla_up_proj
#     with token drop (the default there), mla_up_proj and mlp without (its rows carried here are
#     the MXFP8 32x32 ones: the table gives the others no precision; H100's preset, mla_up_proj
#     and mlp without overlap_grad_reduce, has no row carried).
#   25.11 (v0.2.0, configs/deepseek/workload_base_configs.py): GB300 moe_act, GB200 and B200
#     mla_up_proj (H100's mla_up_proj and mlp: no 25.11 H100 row). The 25.11 table's GB300 rows (pp2 vp4 ep32) and
#     GB200 MXFP8 row (pp8 vp4 ep32) ran other layouts than those presets (pp4 vp4 ep64): the
#     GPU's modules are the closest statement there is.
#   26.08 (v0.6.0, perf_recipes/deepseek/{gb200,gb300}/deepseek_v3.py): GB200 MXFP8
#     mla_up_proj, GB300 MXFP8 none (recompute_modules = []), as the rows' layouts.
DEEPSEEK_RECOMPUTE_UNSTATED = {
    ((25, 9, 0), "B200"): ["mla_up_proj"],
    ((25, 9, 0), "GB200"): ["mla_up_proj"],
    ((25, 11, 0), "GB300"): ["moe_act"],
    ((25, 11, 0), "GB200"): ["mla_up_proj"],
    ((25, 11, 0), "B200"): ["mla_up_proj"],
    ((26, 8, 0), "GB200"): ["mla_up_proj"],
    ((26, 8, 0), "GB300"): [],
}


def deepseek_unstated(e, hw, lay, model):
    """The recompute field a Megatron-Bridge DeepSeek-V3 row ran with where its table leaves it
    out: the release's preset (DEEPSEEK_RECOMPUTE_UNSTATED)."""
    rc = lay.get("recompute")
    key = (mb_release(e), gpu_kind(hw))
    if rc is not None or model.get("family") != "deepseek-v3" or key not in DEEPSEEK_RECOMPUTE_UNSTATED:
        return rc
    return DEEPSEEK_RECOMPUTE_UNSTATED[key]


ALT_WITHOUT_OWN_TOKENS = {
    "mb_2509_h100_fp8blockwise128x128w1x128act_deepseek_v3_1024gpu_alt":
        "the 25.09 table parenthesises only this run's TFLOP/s ('1297 | 338 (330)'): its tokens/s "
        "is not published (the collection repeats the main run's)",
}


def convert_moe(e, reg):
    m, why = moe_model(e, reg)
    if not m:
        return None, why
    model, hw, lay, meas = e["model"], e["hardware"], e["layout"], e.get("measured") or {}
    derived = e.get("derived") or {}
    if not given(lay, "microbatch"):
        return None, "layout.microbatch not given"
    if given(meas, "step_time_s"):
        step, step_derived = meas["step_time_s"], False
    elif given(derived, "step_time_s"):
        step, step_derived = derived["step_time_s"], True
    else:
        return None, "no step time or tokens/s (TFLOP/s are counted differently per source)"
    # As convert_recipe: a row without its precision is not carried (25.09's table has no
    # precision column, and its footnote makes the unparenthesised values quantized too).
    if not given(lay, "precision"):
        return None, "precision not given (%s)" % (lay.get("precision_note") or "")
    # 25.09's H100 DeepSeek-V3 row parenthesises only its TFLOP/s: the alternate run's tokens/s
    # is not in the table (the collection repeats the main run's).
    if str(e["id"]) in ALT_WITHOUT_OWN_TOKENS:
        return None, ALT_WITHOUT_OWN_TOKENS[str(e["id"])]
    stated = deepseek_unstated(e, hw, lay, model)
    rc, modules = recompute_of(stated)
    if rc is None:
        return None, modules
    tp, pp, cp = lay["tp"], lay["pp"], lay.get("cp") or 1
    vp = lay.get("vp") or 1
    if pp == 1:
        vp = 1  # 'VP=12 published with PP=1 (VP has no effect without PP)'
    gpus = hw["total_gpus"]
    if gpus % (tp * pp * cp):
        return None, "total_gpus not a multiple of tp*pp*cp"
    dp = gpus // (tp * pp * cp)
    ep = lay.get("ep") or 1
    # Unstated etp: Megatron-Bridge's MoE presets set expert_tensor_parallel_size=1 (scripts/
    # performance/configs/deepseek/deepseek_workload_base_configs.py BASE_DEEPSEEK_V3_CONFIG);
    # the NeMo-era dgxc recipes ran Megatron's default, tp.
    etp = lay.get("etp") or (1 if str(e["id"]).startswith("mb_") else tp)
    prec = str(lay["precision"]).upper()
    if model.get("key") == "nemotron_3_super" and "FP4" in prec:
        # nemotron_3_super_bf16_with_nvfp4_mixed and te_quant.cfg (perf_recipes/nemotronh/):
        # attention's QKV and projection, the latent projections, MTP and the last 14 layers in
        # BF16, the Mamba out_proj in MXFP8, the rest NVFP4.
        return None, ("NVFP4 here is a per-module mix (attention, latent projections, MTP and "
                      "the last 14 layers BF16; Mamba out_proj MXFP8): one precision per layout "
                      "cannot state it")
    l = dict(tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, ep=ep, etp=etp, micro_batch=lay["microbatch"],
             global_batch=lay["global_batch"], sequence_parallel=tp > 1,
             # Megatron's --recompute-modules as the row names them ('selective: mla_up_proj'
             # reruns MLA's up projections, not the attention core).
             recompute=rc,
             distributed_optimizer=True,
             precision="fp4" if "FP4" in prec else "fp8" if "FP8" in prec else "bf16",
             schedule="interleaved" if vp > 1 else "1f1b", overlap_grad_reduce=True,
             tp_comm_overlap=tp > 1)
    if modules and modules != "core_attn":
        l["recompute_modules"] = modules
    # The same presets turn on the EP all-to-all overlap for DeepSeek-V3 on H100 (25.09/25.11:
    # DEEPSEEK_V3_H100_BASE_CONFIG moe_a2a_overlap=True) and, in later containers, in their
    # MXFP8 Blackwell configs (DEEPSEEK_A2A_OVERLAP_FROM).
    if (str(e["id"]).startswith("mb_") and model.get("family") == "deepseek-v3"
            and (str(hw["gpu"]).startswith("H100") or deepseek_a2a_overlap(e, hw, prec))):
        l["moe_a2a_overlap"] = True
    # ... and the flex dispatcher (moe_flex_dispatcher_backend deepep on H100, hybridep on
    # GB200/GB300) for DeepSeek-V3: taken for every Megatron-Bridge DeepSeek-V3 row (the B200
    # preset read states none; the cost model differs only where the EP group leaves the NVLink
    # domain, as at B200 26.04's ep 32 over 4 nodes).
    if str(e["id"]).startswith("mb_") and model.get("family") == "deepseek-v3" and ep > 1:
        l["moe_flex_dispatcher"] = True
    # Nemotron 3 Super's perf recipes all set moe_token_dispatcher_type "flex" with the
    # hybridep backend (perf_recipes/nemotronh/{b200,b300,gb200,gb300}/nemotronh.py).
    if model.get("key") == "nemotron_3_super" and ep > 1:
        l["moe_flex_dispatcher"] = True
    # Megatron-Bridge's performance recipes reduce gradients in bf16 (perf_recipes/_common.py
    # _perf_precision, scripts/performance's get_precision_config: grad_reduce_in_fp32 False;
    # the Super recipes again in _apply_nemotron_3_super_perf_defaults).
    if str(e["id"]).startswith("mb_"):
        l["grad_reduce_in_bf16"] = True
    mb_precision_aware_optimizer(e, l, deepseek=model.get("family") == "deepseek-v3")
    mb_cross_entropy(e, l)
    layers, stages = m["layers"], pp * vp
    notes = " ".join(str(n) for n in (e.get("notes") or []))
    fl = re.search(r"first (\d+), .*? last (\d+)", notes)
    if fl:
        l["first_stage_layers"], l["last_stage_layers"] = int(fl.group(1)), int(fl.group(2))
    elif layers % stages or (e.get("flags") or {}).get("uneven_pp"):
        text = balanced_layout(layers, stages, m.get("mtp_layers", 0))
        if not text:
            return None, "%d layers over %d stages: no balanced layout string" % (layers, stages)
        l["pipeline_layout"] = text
    src = e["source"]
    row = dict(id=str(e["id"]), source="%s; %s" % (src["title"], src.get("release", "")),
               table="; ".join(str(src[k]) for k in ("table", "path") if src.get(k)),
               family=str(model.get("family")), gpu=str(hw["gpu"]), gpus=gpus, model=m, layout=l,
               step_time_s=step, step_time_derived=step_derived,
               published={k: v for k, v in meas.items()
                          if v is not None and not isinstance(v, (dict, list))})
    return row, None


def same_run(a, b):
    keys = ("tp", "pp", "dp", "cp", "vp", "micro_batch", "global_batch", "precision")
    return (a["gpus"] == b["gpus"] and a["model"]["layers"] == b["model"]["layers"]
            and a["model"]["hidden"] == b["model"]["hidden"]
            and a["model"]["seq_len"] == b["model"]["seq_len"]
            and all(a["layout"][k] == b["layout"][k] for k in keys)
            and abs(a["step_time_s"] - b["step_time_s"]) <= 0.02 * b["step_time_s"])


def scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def flow(d):
    return "{" + ", ".join("%s: %s" % (k, scalar(v)) for k, v in d.items()) + "}"


RUNS_HEADER = """\
# Published, measured Megatron/NeMo training runs with their full layouts: what `ptdp validate`
# checks the cost model against (data/published/README.md). Each row names its source; the
# numbers are the sources' own (step_time_derived: the step time computed from the published
# tokens/s or TFLOP/s as global_batch * seq_len / (tokens/s/GPU * GPUs), not printed as such).
# Keys: model as in a model YAML (configs/models/), layout as in plan.yaml; published: the
# source's measured cells as printed (tokens/s per GPU, TFLOP/s per GPU, MFU %).
# Units: step_time_s seconds; layer_fwd_bwd_ms milliseconds (one layer's forward + backward).
ptdp_published_runs_version: 1
runs:
"""

MOE_HEADER = """\
# Published, measured Mixture-of-Experts training runs (DeepSeek-V3, Grok-1, Llama 4, Mixtral,
# the hybrid Mamba-MoE Nemotron 3 Nano and Super) on
# H100 and Blackwell with their full layouts: the MoE rows of the team's megatron_recipes
# collection, carried over by scripts/import-published.py --moe (data/published/README.md; its
# docstring states each interpretation). Every step time is derived from the published tokens/s
# per GPU or printed as such, never from TFLOP/s. `family` groups the rows in ptdp validate.
ptdp_published_runs_version: 1
runs:
"""

RECIPES_HEADER = """\
# Published, measured Megatron-Bridge / NeMo / dgxc-benchmarking training runs on H100 and
# Blackwell (B200, GB200/GB300 NVL72) with their full layouts: the dense rows of the team's megatron_recipes collection, carried over by
# scripts/import-published.py --recipes (data/published/README.md). Each row names its source;
# every step time is derived from the published tokens/s per GPU as global_batch * seq_len /
# (tokens/s/GPU * GPUs) (step_time_derived), never from TFLOP/s, which the sources count
# differently. Keys as in runs.yaml.
ptdp_published_runs_version: 1
runs:
"""


def main():
    dropped = []
    if sys.argv[1] == "--moe":
        src = yaml.safe_load(open(sys.argv[2]))
        reg = src.get("model_registry") or {}
        rows = []
        for e in src["entries"]:
            gpu = str(e["hardware"].get("gpu", ""))
            if not e["model"].get("moe") or not gpu.startswith(("H100", "B200", "B300", "GB200", "GB300")):
                continue
            if e["model"].get("family") not in MOE_FAMILIES + ("nemotron-3",):
                row, why = None, ("hybrid Mamba-MoE model (%s): ptdp does not model Mamba layers"
                                  % e["model"].get("family"))
            else:
                row, why = convert_moe(e, reg)
            if row:
                rows.append(row)
            else:
                dropped.append((str(e.get("id", "")), why))
        header = MOE_HEADER
    elif sys.argv[1] == "--recipes":
        src = yaml.safe_load(open(sys.argv[2]))
        shipped = yaml.safe_load(open(sys.argv[3]))["runs"]
        rows = []
        for e in src["entries"]:
            gpu = str(e["hardware"].get("gpu", ""))
            if (not gpu.startswith(("H100", "B200", "B300", "GB200", "GB300")) or e["model"].get("moe")
                    or e["model"].get("hybrid_layer_counts")):
                continue
            row, why = convert_recipe(e)
            dup = [s["id"] for s in shipped if row and "step_time_s" in s and same_run(row, s)]
            if dup:
                row, why = None, "the same run as runs.yaml's " + dup[0]
            if row:
                rows.append(row)
            else:
                dropped.append((str(e.get("id", "")), why))
        header = RECIPES_HEADER
    else:
        src = yaml.safe_load(open(sys.argv[1]))
        rows = []
        for e in src["entries"]:
            row, why = convert(e)
            if row:
                rows.append(row)
            else:
                dropped.append((str(e.get("id", "")), why))
        header = RUNS_HEADER
    out = sys.stdout
    out.write(header)
    for r in rows:
        out.write("- id: %s\n" % scalar(r["id"]))
        out.write("  source: %s\n" % scalar(r["source"]))
        if r.get("table"):
            out.write("  table: %s\n" % scalar(r["table"]))
        if r.get("family"):
            out.write("  family: %s\n" % scalar(r["family"]))
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
