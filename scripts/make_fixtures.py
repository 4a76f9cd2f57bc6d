#!/usr/bin/env python3
"""Golden fixtures for the engine's new architectures, made by Hugging Face transformers itself.

For each architecture (Qwen3 dense, Qwen3-MoE in two layouts, Mixtral) builds a tiny model with
random weights from a fixed seed, scaled so that activations stay near unit size and the router's
choices have real margins, saves it with `save_pretrained`, and writes `reference.json` beside it:
- for each prompt (token ids), the greedy continuation (a full forward per step, no cache) with
  the top-1/top-2 logit margin of each step;
- the logits at every position of prompt + continuation (one teacher-forced forward);
- for MoE models, at every position and sparse layer: the router's top-k experts, their weights
  as the model applies them, and the margin between the k-th and the (k+1)-th softmax score.
All in fp32 on the CPU (eager attention), so the figures do not depend on the GPU's arithmetic.

Where the in-memory state dict names or shapes tensors differently from what `save_pretrained`
wrote (transformers 5 fuses experts in memory: `mlp.experts.gate_up_proj` [experts, 2 x width,
hidden] and `mlp.experts.down_proj` [experts, hidden, width]), a sibling folder `qwen3-moe-fused/`
holds the Qwen3-MoE model written as the in-memory tensors, so the loader is tested on both forms
(the others' fused forms differ only in their prefixes).

Runs wherever transformers and PyTorch are installed (a GPU machine's Python, typically):
  python3 scripts/make_fixtures.py [--out models/fixtures] [--only qwen3,qwen3-moe,...]
The byte tokenizer of models/tiny-reverse (260 ids, <s>=256, </s>=257) fits every fixture's
vocabulary; copy its tokenizer files in to serve a fixture (scripts/make_fixtures.py does it
when it finds them).
"""
import argparse
import json
import math
import os
import shutil
import sys
import time
import traceback

import torch
import transformers

VOCAB = 260
BOS, EOS = 256, 257
GREEDY_STEPS = 12
FUSED = {"qwen3-moe"}  # fixtures also written in transformers' in-memory (fused) form
PROMPTS = [
    [BOS],
    [BOS, 114, 101, 118, 101, 114, 115, 101, 58, 32, 104, 105],  # "reverse: hi"
    [BOS] + [(i * 37 + 11) % 256 for i in range(20)],
    [BOS] + [(i * 101 + 7) % 256 for i in range(40)],
]

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=BOS,
    eos_token_id=EOS,
)


def v5():
    return int(transformers.__version__.split(".")[0]) >= 5


def make_config(cls, rope_theta, **kw):
    """Builds a config with the RoPE base set the way this transformers version keeps it."""
    if v5():
        cfg = cls(rope_parameters={"rope_type": "default", "rope_theta": rope_theta}, **kw)
        got = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    else:
        cfg = cls(rope_theta=rope_theta, **kw)
        got = getattr(cfg, "rope_theta", None)
    if got is None or abs(float(got) - rope_theta) > 1e-6:
        raise RuntimeError(f"rope_theta did not take: {got}")
    return cfg


def fixtures():
    """name -> (model class, config) for every fixture."""
    out = {}
    out["qwen3"] = lambda: (
        transformers.Qwen3ForCausalLM,
        make_config(transformers.Qwen3Config, 10000.0, intermediate_size=256, num_hidden_layers=3,
                    head_dim=64,  # q is 4 x 64 = 256 wide, not hidden_size
                    tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                    **COMMON))
    out["qwen3-moe"] = lambda: (
        transformers.Qwen3MoeForCausalLM,
        make_config(transformers.Qwen3MoeConfig, 10000.0, intermediate_size=256,
                    moe_intermediate_size=64, num_hidden_layers=4, head_dim=32, num_experts=8,
                    num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                    mlp_only_layers=[1], tie_word_embeddings=False, attention_bias=False,
                    use_sliding_window=False, output_router_logits=False, **COMMON))
    out["qwen3-moe-step2"] = lambda: (
        transformers.Qwen3MoeForCausalLM,
        make_config(transformers.Qwen3MoeConfig, 1000000.0, intermediate_size=192,
                    moe_intermediate_size=48, num_hidden_layers=4, head_dim=32, num_experts=6,
                    num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2,
                    mlp_only_layers=[], tie_word_embeddings=False, attention_bias=False,
                    use_sliding_window=False, output_router_logits=False, **COMMON))
    out["mixtral"] = lambda: (
        transformers.MixtralForCausalLM,
        make_config(transformers.MixtralConfig, 1000000.0, intermediate_size=96,
                    num_hidden_layers=3, num_local_experts=8, num_experts_per_tok=2,
                    sliding_window=None, tie_word_embeddings=False,
                    output_router_logits=False, **COMMON))
    return out


def is_router(name, module):
    """The MoE block's router: `...mlp.gate` (Qwen3-MoE) or `...block_sparse_moe.gate` (Mixtral)."""
    last = name.rsplit(".", 1)[-1]
    return last == "gate" and hasattr(module, "weight") and module.weight.dim() == 2 and ".layers." in "." + name


@torch.no_grad()
def scale_weights(model, cfg):
    """Random weights of a size that keeps every layer's output near unit scale: linear maps with
    std 1/sqrt(fan_in), embeddings std 1, norm gains 1 + N(0, 0.1), routers with std 3/sqrt(fan_in)
    (router logits of std ~3: real margins between experts)."""
    g = torch.Generator().manual_seed(1234)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:  # biases
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
        elif "embed_tokens" in name:
            # (every layer normalises its input; tied, these are the LM head too: logits of std ~3)
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        else:
            # Fused expert tensors are [experts, out, in] or [experts, in, out]: the fan-in is the
            # hidden size for gate/up and the expert width for down; the smaller of the last two
            # dimensions that is not the output is found from the config below.
            fan_in = p.shape[-1]
            if p.dim() == 3:
                hidden = cfg.hidden_size
                # [E, 2I, H] or [E, I, H] reads H; [E, H, I] reads I; [E, H, 2I] (in, out) reads H
                if "down" in name:
                    fan_in = p.shape[-1] if p.shape[-2] == hidden else p.shape[-2]
                else:
                    fan_in = hidden
            gain = 1.0
            if is_router(name.rsplit(".weight", 1)[0], _Dummy(p)):
                gain = 3.0
            elif name.startswith("lm_head"):
                gain = 2.0
            std = gain / math.sqrt(fan_in)
            p.copy_(std * torch.randn(p.shape, generator=g))


class _Dummy:
    def __init__(self, p):
        self.weight = p


def routers(model):
    return [(n, m) for n, m in model.named_modules() if is_router(n, m)]


def layer_index(name):
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1])


@torch.no_grad()
def reference(model, cfg, kind):
    top_k = getattr(cfg, "num_experts_per_tok", 0)
    renorm = True if kind == "mixtral" else bool(getattr(cfg, "norm_topk_prob", False))
    captured = {}
    hooks = []
    for name, module in routers(model):
        def pre(mod, args, kwargs, name=name):
            x = args[0] if args else next(iter(kwargs.values()))
            captured[name] = x.reshape(-1, x.shape[-1]).float()
        hooks.append(module.register_forward_pre_hook(pre, with_kwargs=True))
    prompts = []
    try:
        for prompt in PROMPTS:
            ids = list(prompt)
            steps = []
            for _ in range(GREEDY_STEPS):
                logits = model(torch.tensor([ids])).logits[0, -1].float()
                top2 = torch.topk(logits, 2)
                steps.append({"token": int(top2.indices[0]),
                              "margin": float(top2.values[0] - top2.values[1])})
                ids.append(int(top2.indices[0]))
            captured.clear()
            logits = model(torch.tensor([ids])).logits[0].float()
            entry = {
                "prompt": prompt,
                "greedy": [s["token"] for s in steps],
                "greedy_margins": [round(s["margin"], 6) for s in steps],
                "logits": [[float(f"{v:.7g}") for v in row.tolist()] for row in logits],
            }
            if captured:
                layers = []
                for name, module in routers(model):
                    x = captured[name]
                    scores = torch.softmax(x @ module.weight.float().t(), dim=-1)
                    top = torch.topk(scores, top_k + 1 if top_k < scores.shape[-1] else top_k, dim=-1)
                    chosen = top.indices[:, :top_k]
                    weights = top.values[:, :top_k]
                    if renorm:
                        weights = weights / weights.sum(-1, keepdim=True)
                    margins = (top.values[:, top_k - 1] - top.values[:, top_k]) if top_k < scores.shape[-1] \
                        else torch.ones(scores.shape[0])
                    layers.append({
                        "layer": layer_index(name),
                        "experts": chosen.tolist(),
                        "weights": [[float(f"{v:.7g}") for v in row] for row in weights.tolist()],
                        "margins": [float(f"{v:.6g}") for v in margins.tolist()],
                    })
                entry["routing"] = layers
            prompts.append(entry)
    finally:
        for h in hooks:
            h.remove()
    return prompts


def tensor_list(path):
    from safetensors import safe_open
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(path, f), "pt") as st:
                for k in st.keys():
                    out[k] = list(st.get_slice(k).get_shape())
    return out


def make(name, build, out_dir, tokenizer_dir):
    t0 = time.time()
    cls, cfg = build()
    torch.manual_seed(0)
    cfg._attn_implementation = "eager"
    model = cls(cfg).float()
    model.eval()
    scale_weights(model, cfg)
    path = os.path.join(out_dir, name)
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path, safe_serialization=True)
    for f in os.listdir(path):
        os.chmod(os.path.join(path, f), 0o644)
    if tokenizer_dir:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(tokenizer_dir, f)):
                shutil.copy(os.path.join(tokenizer_dir, f), path)
    saved = tensor_list(path)
    memory = {k: list(v.shape) for k, v in model.state_dict().items()}
    if getattr(cfg, "tie_word_embeddings", False):
        memory.pop("lm_head.weight", None)
    # Reload what was saved: the reference is computed from the saved model, so a save that drops
    # or renames a tensor shows here rather than in the engine's test.
    dtype = {"dtype" if v5() else "torch_dtype": torch.float32}
    reloaded = cls.from_pretrained(path, attn_implementation="eager", **dtype)
    reloaded.eval()
    again = reloaded.state_dict()
    for k, v in model.state_dict().items():
        if k not in again or not torch.equal(v, again[k]):
            raise RuntimeError(f"{name}: {k} differs after save_pretrained/from_pretrained")
    ref = {
        "source": f"scripts/make_fixtures.py with transformers {transformers.__version__}, "
                  f"torch {torch.__version__}, fp32 on the CPU, eager attention",
        "model_type": cfg.model_type,
        "renormalize_top_k": True if cfg.model_type == "mixtral" else bool(getattr(cfg, "norm_topk_prob", False)),
        "prompts": reference(reloaded, cfg, cfg.model_type),
        "saved_tensors": saved,
    }
    differs = set(saved) != set(memory) or any(saved[k] != memory[k] for k in saved if k in memory)
    if differs and name in FUSED:
        # transformers' in-memory form differs from what it saves: keep that form too.
        from safetensors.torch import save_file
        fused = path + "-fused"
        shutil.rmtree(fused, ignore_errors=True)
        os.makedirs(fused)
        for f in os.listdir(path):
            if not f.endswith(".safetensors") and not f.endswith(".index.json"):
                shutil.copy(os.path.join(path, f), fused)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if getattr(cfg, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, os.path.join(fused, "model.safetensors"), metadata={"format": "pt"})
        ref["memory_tensors"] = memory
        with open(os.path.join(fused, "reference.json"), "w") as f:
            json.dump({"same_as": name, "memory_tensors": memory}, f, indent=1)
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    print(f"make_fixtures: {name}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"{len(saved)} saved tensors, {time.time() - t0:.1f}s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/fixtures")
    ap.add_argument("--only", default="")
    ap.add_argument("--tokenizer", default="models/tiny-reverse")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    print(f"make_fixtures: transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    failed = 0
    for name, build in fixtures().items():
        if args.only and name not in args.only.split(","):
            continue
        try:
            make(name, build, args.out, args.tokenizer)
        except Exception:
            failed += 1
            print(f"make_fixtures: {name} FAILED", flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
