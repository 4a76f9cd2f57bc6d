#!/usr/bin/python3
"""Trains the bundled model: a ~1M-parameter Llama that answers `reverse: <text>` with <text> reversed.

Writes a Hugging Face folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json) plus reference.json: PyTorch's greedy token ids and top logits for held-out
prompts, which the engine's golden test reproduces. Deterministic (fixed seeds, single process).

Usage: /usr/bin/python3 scripts/train_tiny_model.py [--out models/tiny-reverse] [--steps 600]
Debian's python3-torch is importable only from /usr/bin/python3.
"""
import argparse
import json
import math
import os
import random
import struct
import time

import torch
import torch.nn.functional as F

VOCAB_BYTES = 256
BOS, EOS, USER, ASSISTANT = 256, 257, 258, 259
SPECIALS = {BOS: "<s>", EOS: "</s>", USER: "<|user|>", ASSISTANT: "<|assistant|>"}
VOCAB = 260

CONFIG = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode map, used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def encode_prompt(text):
    return [BOS, USER] + list(("reverse: " + text).encode()) + [ASSISTANT]


def random_text(rng):
    n = rng.randint(1, 32)
    if rng.random() < 0.5:
        return "".join(chr(rng.randint(32, 126)) for _ in range(n))
    words = []
    while sum(len(w) + 1 for w in words) < n:
        words.append("".join(chr(rng.randint(97, 122)) for _ in range(rng.randint(1, 8))))
    return " ".join(words)[:n]


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.nh, self.nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = d // self.nh
        self.input_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.q_proj = torch.nn.Linear(d, self.nh * self.hd, bias=False)
        self.k_proj = torch.nn.Linear(d, self.nkv * self.hd, bias=False)
        self.v_proj = torch.nn.Linear(d, self.nkv * self.hd, bias=False)
        self.o_proj = torch.nn.Linear(self.nh * self.hd, d, bias=False)
        self.gate_proj = torch.nn.Linear(d, c["intermediate_size"], bias=False)
        self.up_proj = torch.nn.Linear(d, c["intermediate_size"], bias=False)
        self.down_proj = torch.nn.Linear(c["intermediate_size"], d, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        o = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o_proj(o)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = torch.nn.Embedding(VOCAB, c["hidden_size"])
        torch.nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = torch.nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        hd = c["hidden_size"] // c["num_attention_heads"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        freqs = torch.outer(torch.arange(c["max_position_embeddings"], dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, ids, pad_mask=None):
        b, t = ids.shape
        x = self.embed_tokens(ids)
        mask = torch.full((t, t), float("-inf")).triu(1)
        cos, sin = self.cos[:t], self.sin[:t]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x) @ self.embed_tokens.weight.t()


def make_batch(rng, n):
    seqs, masks = [], []
    for _ in range(n):
        text = random_text(rng)
        p = encode_prompt(text)
        target = list(text[::-1].encode()) + [EOS]
        seqs.append(p + target)
        masks.append([0] * len(p) + [1] * len(target))
    t = max(len(s) for s in seqs)
    ids = torch.full((n, t), EOS, dtype=torch.long)
    loss_mask = torch.zeros((n, t), dtype=torch.float32)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, :len(s)] = torch.tensor(s)
        loss_mask[i, :len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids, loss_mask


@torch.no_grad()
def greedy(model, prompt, max_new=40, top=4):
    ids = list(prompt)
    out, tops = [], []
    for _ in range(max_new):
        logits = model(torch.tensor([ids]))[0, -1]
        vals, idx = logits.topk(top)
        tops.append([[int(i), float(v)] for i, v in zip(idx, vals)])
        nxt = int(idx[0])
        out.append(nxt)
        ids.append(nxt)
        if nxt == EOS:
            break
    return out, tops


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors:
        data = t.detach().contiguous().to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def write_model(out, model):
    c = model.c
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
        "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "float32",
        "bos_token_id": BOS, "eos_token_id": EOS, "attention_bias": False,
        "head_dim": c["hidden_size"] // c["num_attention_heads"], **c,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": EOS, "max_length": 128}, f, indent=2)
    tensors = [("model.embed_tokens.weight", model.embed_tokens.weight)]
    for i, l in enumerate(model.layers):
        p = f"model.layers.{i}."
        tensors += [
            (p + "input_layernorm.weight", l.input_layernorm.weight),
            (p + "self_attn.q_proj.weight", l.q_proj.weight),
            (p + "self_attn.k_proj.weight", l.k_proj.weight),
            (p + "self_attn.v_proj.weight", l.v_proj.weight),
            (p + "self_attn.o_proj.weight", l.o_proj.weight),
            (p + "post_attention_layernorm.weight", l.post_attention_layernorm.weight),
            (p + "mlp.gate_proj.weight", l.gate_proj.weight),
            (p + "mlp.up_proj.weight", l.up_proj.weight),
            (p + "mlp.down_proj.weight", l.down_proj.weight),
        ]
    tensors.append(("model.norm.weight", model.norm.weight))
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)

    b2u = bytes_to_unicode()
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i, s in SPECIALS.items()
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": {b2u[b]: b for b in range(256)}, "merges": []},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
    template = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                "<|user|>{{ message['content'] }}{% elif message['role'] == 'assistant' %}"
                "<|assistant|>{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False,
                   "model_max_length": 128, "tokenizer_class": "PreTrainedTokenizerFast",
                   "chat_template": template}, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "models", "tiny-reverse"))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-reference", type=int, default=256)
    ap.add_argument("--num-eval", type=int, default=1000)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(1234)
    torch.set_num_threads(args.threads)
    rng = random.Random(1234)
    model = Llama(CONFIG)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params={n_params}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    start = time.time()
    for step in range(args.steps):
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps)) if step > 20 else args.lr * (step + 1) / 21
        for g in opt.param_groups:
            g["lr"] = lr
        ids, m = make_batch(rng, args.batch)
        logits = model(ids[:, :-1])
        loss = (F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="none")
                * m[:, 1:].reshape(-1)).sum() / m[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step={step} loss={loss.item():.4f} lr={lr:.2e} elapsed_s={time.time() - start:.0f}", flush=True)

    model.eval()
    held = random.Random(987654321)
    correct, n_eval = 0, args.num_eval
    for _ in range(n_eval):
        text = random_text(held)
        out, _ = greedy(model, encode_prompt(text), top=1)
        correct += bytes(t for t in out if t < 256) == text[::-1].encode() and out[-1] == EOS
    acc = correct / n_eval
    print(f"held_out_exact_accuracy={acc:.4f}", flush=True)

    write_model(args.out, model)
    ref_rng = random.Random(55555)
    cases = []
    for _ in range(args.num_reference):
        text = random_text(ref_rng)
        prompt = encode_prompt(text)
        out, tops = greedy(model, prompt)
        cases.append({"text": text, "prompt_ids": prompt, "output_ids": out, "top_logits": tops})
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump({"held_out_exact_accuracy": acc, "train_steps": args.steps,
                   "note": "greedy decoding in fp32 by PyTorch; top_logits[i] = [[token_id, logit], ...] "
                           "for the step that produced output_ids[i]",
                   "cases": cases}, f, separators=(",", ":"))
    print(f"wrote {args.out} in {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
