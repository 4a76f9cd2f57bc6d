#!/usr/bin/env python3
"""The side-by-side baseline for scripts/bench_gpu.sh: Hugging Face transformers (PyTorch, eager,
SDPA attention) on the same GPU and the same Llama-3-8B shape with random bf16 weights made on the
GPU. Measures what the engine benchmark measures: decode tokens/s at several batch sizes after
512-token prompts, prefill tokens/s for 2,048-token prompts, and batch-1 memory-bandwidth
utilisation against a device-to-device copy timed in the same run. Last line: one JSON object."""
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


def build_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
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
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128256)
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
    # A decode token reads every weight but the (untied) embedding table, of which it gathers a row.
    embed = model.get_input_embeddings().weight
    decode_weight_bytes = weight_bytes - embed.numel() * embed.element_size()
    decode, step_s = {}, {}
    for b in [int(x) for x in args.batches.split(",")]:
        tok_s, dt = decode_rate(model, b, args.prompt, args.steps, args.vocab)
        decode[str(b)] = round(tok_s, 1)
        step_s[str(b)] = dt
        print(f"hf decode batch {b}: {tok_s:.1f} tok/s ({dt * 1e3:.2f} ms/step)", flush=True)
    prefill = prefill_rate(model, args.prefill_batch, args.prefill_prompt, args.vocab)
    print(f"hf prefill: {prefill:.0f} tok/s", flush=True)
    first = str(int(args.batches.split(",")[0]))
    print(json.dumps({
        "impl": f"transformers {transformers.__version__} / torch {torch.__version__} (eager, sdpa)",
        "device": torch.cuda.get_device_name(),
        "weight_bytes": weight_bytes,
        "decode_weight_bytes": decode_weight_bytes,
        "copy_bytes_per_s": bw,
        "batch1_mbu": decode_weight_bytes / step_s[first] / bw if first == "1" else None,
        "decode_tok_s": decode,
        "prefill_tok_s": round(prefill, 1),
    }))


if __name__ == "__main__":
    main()
