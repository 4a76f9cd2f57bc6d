#!/usr/bin/env python3
"""The side-by-side baseline for scripts/bench_gpu.sh: Hugging Face transformers (PyTorch, SDPA
attention) on the same GPU and the same shape with random bf16 weights made on the GPU: the
Llama-3-8B shape, or with --moe qwen3-30b-a3b the Qwen3-30B-A3B mixture of experts. Measures what
the engine benchmark measures: decode tokens/s at several batch sizes after 512-token prompts,
prefill tokens/s for 2,048-token prompts, and batch-1 memory-bandwidth utilisation against a
device-to-device copy timed in the same run. Eager by default; with --compile, decoding takes
PyTorch's strongest form here, as gpt-fast does: a static KV cache and the decode step through
torch.compile with CUDA graphs (mode reduce-overhead); of a mixture of experts, with --experts
batched_mm, the experts backend of static shapes that compiles. A JSON line after each phase (the figures
so far); the last line is the whole."""
import argparse
import json
import time

import torch


def copy_bandwidth(nbytes=2 << 30, reps=20):
    """Bytes read plus bytes written per second by a large device-to-device copy."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return 2 * src.numel() * 2 / times[len(times) // 2]


def rope(theta):
    """The RoPE base as this transformers version takes it (5 moved it into rope_parameters)."""
    import transformers
    if int(transformers.__version__.split(".")[0]) >= 5:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
    return {"rope_theta": theta}


def build_model(args):
    import transformers
    if args.moe == "qwen3-30b-a3b":
        cls = transformers.Qwen3MoeForCausalLM
        cfg = transformers.Qwen3MoeConfig(
            vocab_size=args.vocab or 151936, hidden_size=2048, intermediate_size=6144,
            num_hidden_layers=args.layers or 48, num_attention_heads=32, num_key_value_heads=4,
            head_dim=128, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
            norm_topk_prob=True, max_position_embeddings=8192, rms_norm_eps=1e-6,
            tie_word_embeddings=False, **rope(1e6))
    elif args.moe:
        raise SystemExit(f"unknown --moe {args.moe}")
    else:
        cls = transformers.LlamaForCausalLM
        cfg = transformers.LlamaConfig(
            vocab_size=args.vocab or 128256, hidden_size=4096, intermediate_size=14336,
            num_hidden_layers=args.layers or 32, num_attention_heads=32, num_key_value_heads=8,
            max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False,
            **rope(500000.0))
    args.vocab = cfg.vocab_size
    cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = cls(cfg)
    torch.set_default_dtype(torch.float32)
    model.to(torch.bfloat16)  # whatever dtype the config asked for: the bytes per token must match ours
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    model.eval()
    return model


@torch.inference_mode()
def decode_rate(model, batch, prompt_len, steps, vocab):
    ids = torch.randint(0, vocab, (batch, prompt_len), device="cuda")
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(2):  # warm-up decode steps
        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del past, out
    torch.cuda.empty_cache()
    return batch * steps / dt, dt / steps


def static_cache(model, batch, max_len):
    """A StaticCache, whichever of its signatures this transformers version has."""
    from transformers import StaticCache
    for kwargs in ({"config": model.config, "max_cache_len": max_len},
                   {"config": model.config, "max_batch_size": batch, "max_cache_len": max_len,
                    "device": "cuda", "dtype": torch.bfloat16}):
        try:
            return StaticCache(**kwargs)
        except TypeError:
            continue
    raise RuntimeError("no StaticCache signature fits")


@torch.inference_mode()
def decode_rate_compiled(model, step, batch, prompt_len, steps, vocab):
    """Decoding with a static cache and `step` (the compiled forward), after an eager prefill."""
    cache = static_cache(model, batch, prompt_len + steps + 8)
    ids = torch.randint(0, vocab, (batch, prompt_len), device="cuda")
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
                cache_position=torch.arange(prompt_len, device="cuda"))
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    pos = prompt_len

    def one():
        nonlocal nxt, pos
        o = step(input_ids=nxt, past_key_values=cache, use_cache=True,
                 cache_position=torch.tensor([pos], device="cuda"))
        nxt = o.logits[:, -1].argmax(-1, keepdim=True).clone()
        pos += 1
    for _ in range(3):  # compiles, then records the CUDA graphs
        one()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        one()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del cache
    torch.cuda.empty_cache()
    return batch * steps / dt, dt / steps


@torch.inference_mode()
def prefill_rate(model, batch, prompt_len, vocab, reps=3):
    ids = torch.randint(0, vocab, (batch, prompt_len), device="cuda")
    model(input_ids=ids, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        model(input_ids=ids, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    return batch * prompt_len * reps / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--moe", default="", help="qwen3-30b-a3b: that mixture of experts' shape")
    p.add_argument("--compile", action="store_true", help="static cache + torch.compile decoding")
    p.add_argument("--experts", default="",
                   help="a mixture of experts' experts backend (transformers 5's "
                        "experts_implementation: eager, batched_mm, grouped_mm); default the model's")
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--vocab", type=int, default=0)
    p.add_argument("--batches", default="1,16,64,256")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--prefill-prompt", type=int, default=2048)
    p.add_argument("--prefill-batch", type=int, default=4)
    args = p.parse_args()
    import transformers
    bw = copy_bandwidth()
    model = build_model(args)
    weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    # A decode token reads every weight but the (untied) embedding table, of which it gathers a row;
    # of a mixture of experts, only its top k experts per layer.
    embed = model.get_input_embeddings().weight
    decode_weight_bytes = weight_bytes - embed.numel() * embed.element_size()
    if args.moe:
        cfg = model.config
        experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
        expert_bytes = cfg.num_hidden_layers * experts * 3 * cfg.moe_intermediate_size * cfg.hidden_size * 2
        decode_weight_bytes -= expert_bytes - expert_bytes // experts * cfg.num_experts_per_tok
    form = "static cache, torch.compile reduce-overhead" if args.compile else "eager"
    errors = {}
    if args.moe and args.experts:
        # The experts' loop over the experts a step hit has data-dependent shapes, which
        # torch.compile breaks its graph at, expert after expert (the 48-layer model did not
        # compile in 100 s); batched_mm gathers each token's top-k experts' weights and runs one
        # batched product of static shapes, the form transformers documents as fastest for small
        # inputs under compilation.
        try:
            model.set_experts_implementation(args.experts)
            form += f", experts {args.experts}"
        except Exception as e:  # an older transformers: the model's own experts
            errors["experts"] = f"{type(e).__name__}: {e}"[:300]
    result = {
        "impl": f"transformers {transformers.__version__} / torch {torch.__version__} ({form}, sdpa)",
        "device": torch.cuda.get_device_name(),
        "weight_bytes": weight_bytes,
        "decode_weight_bytes": decode_weight_bytes,
        "copy_bytes_per_s": bw,
        "decode_tok_s": {},
        "errors": errors,
    }
    step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False) if args.compile else None
    first = str(int(args.batches.split(",")[0]))
    for b in [int(x) for x in args.batches.split(",")]:
        try:
            if args.compile:
                tok_s, dt = decode_rate_compiled(model, step, b, args.prompt, args.steps, args.vocab)
            else:
                tok_s, dt = decode_rate(model, b, args.prompt, args.steps, args.vocab)
        except Exception as e:  # a failed batch size loses only its own figure
            result["errors"][f"decode batch {b}"] = f"{type(e).__name__}: {e}"[:300]
            print(f"hf decode batch {b}: {e}", flush=True)
            continue
        result["decode_tok_s"][str(b)] = round(tok_s, 1)
        if str(b) == first == "1":
            result["batch1_mbu"] = decode_weight_bytes / dt / bw
        print(f"hf decode batch {b}: {tok_s:.1f} tok/s ({dt * 1e3:.2f} ms/step)", flush=True)
        print(json.dumps(result), flush=True)
    try:
        prefill = prefill_rate(model, args.prefill_batch, args.prefill_prompt, args.vocab)
        result["prefill_tok_s"] = round(prefill, 1)
        print(f"hf prefill: {prefill:.0f} tok/s", flush=True)
    except Exception as e:
        result["errors"]["prefill"] = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
