#!/usr/bin/env python3
"""Builds the tiny Qwen3.5 reference model and its HF logits (run on the device image).

Needs torch + transformers >= 5.2 (checked with the spec on 5.17 / torch 2.11), no numpy, no `gguf`
package, no network. Runs on the CPU in fp32 (a GPU is not needed).

    python3 tests/reference/make_reference.py OUT_DIR            # writes OUT_DIR/{tiny_ref.gguf,
                                                                   #   reference.json, reference.bin}

What it does (shared/spec/model.md section numbers in brackets):
  1. Qwen3_5ForCausalLM(Qwen3_5TextConfig(...)) with 8 layers (GDN x3, attention, GDN x3, attention),
     H=256, FFN 512, 4 q heads / 2 kv heads of 64 (16 rotary dims), GDN 2 K heads / 6 V heads
     (V/K ratio 3), dk = dv = 32, vocab 512. Zero-centred norms, the gated norm, dt_bias and A_log are
     randomised (§11.2 pitfalls). Every 2-D weight is snapped to the Q8_0 grid (per 32-block fp16 scale
     d and int8 q, value = d*q, exact in fp32) so that the GGUF can store it losslessly as Q8_0 and the
     committed test data stay small (~7 MB instead of ~24 MB in F32). `--f32` stores them as F32.
  2. An MTP block (§8.2) in plain PyTorch with random weights (transformers has none), using a
     gated-attention decoder layer of our own whose output is checked against HF's full-attention
     Qwen3_5DecoderLayer (layer 3 of the trunk, captured with a hook).
  3. GGUF export in llama.cpp's conventions (§9.6): names, +1 on zero-centred norms except
     linear_attn.norm, ssm_a = -exp(A_log), conv squeezed to {4, C}, V heads grouped -> tiled on every
     V-indexed tensor incl. the input columns of ssm_out, MTP as layer n_layer (§8.4), metadata of
     §9.3 with llama.cpp's types, tokenizer.ggml.model = "none".
  4. Reference outputs for 4 prompts (random ids, lengths 1, 7, 33, 97):
       prefill  - one HF forward, logits of every position, plus the final-normed hidden states;
       decode   - token by token through HF's cache (past_key_values), logits per step;
       mtp      - our MTP module over the prompt (slot i pairs token x_{i+1} with h_i at position i;
                  the last slot uses the greedy next token), then 3 recursive draft steps
                  (token = argmax of the previous MTP logits, hidden = previous MTP h').
"""
import argparse
import json
import math
import os
import struct
import sys
from array import array

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_writer as gw  # noqa: E402

# ---- model shape ---------------------------------------------------------------------------------
N_LAYER = 8
H = 256          # hidden
FF = 512         # FFN
NH, NKV, HD = 4, 2, 64
ROT = 16         # partial_rotary_factor 0.25 * HD
MROPE = [3, 3, 2]  # sums to ROT / 2
NK, NV, DK, DV = 2, 6, 32, 32
R = NV // NK
VOCAB = 512
EPS = 1e-6
THETA = 1e7
CONV = 4
CTX = 4096
PROMPT_LENS = [1, 7, 33, 97]
N_DRAFT = 3
MTP_IDX = N_LAYER  # GGUF layer index of the MTP block

assert sys.byteorder == "little"


def is_attention(i):
    return (i + 1) % 4 == 0


def build_config():
    from transformers import Qwen3_5TextConfig
    return Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=H, intermediate_size=FF, num_hidden_layers=N_LAYER,
        num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
        linear_num_key_heads=NK, linear_num_value_heads=NV, linear_key_head_dim=DK,
        linear_value_head_dim=DV, linear_conv_kernel_dim=CONV, rms_norm_eps=EPS,
        max_position_embeddings=CTX, tie_word_embeddings=False,
        layer_types=["full_attention" if is_attention(i) else "linear_attention"
                     for i in range(N_LAYER)],
        rope_parameters={"rope_type": "default", "rope_theta": THETA,
                         "partial_rotary_factor": ROT / HD, "mrope_section": list(MROPE)})


# ---- Q8_0 grid ------------------------------------------------------------------------------------
def q8_0_quantize(w):
    """w [rows, n] fp32, n % 32 == 0 -> (d fp16 [rows, n/32], q int8 [rows, n]) the way ggml's
    quantize_row_q8_0 does it: d = amax/127 rounded to fp16, q = round(x/d)."""
    rows, n = w.shape
    assert n % 32 == 0, w.shape
    b = w.reshape(rows, n // 32, 32)
    d16 = (b.abs().amax(-1) / 127.0).to(torch.float16)
    d = d16.float()[..., None]
    safe = torch.where(d > 0, d, torch.ones_like(d))
    q = torch.where(d > 0, torch.round(b / safe), torch.zeros_like(b)).clamp_(-127, 127)
    return d16, q.to(torch.int8).reshape(rows, n)


def q8_0_dequantize(d16, q):
    rows, n = q.shape
    return (d16.float()[..., None] * q.float().reshape(rows, n // 32, 32)).reshape(rows, n)


def snap_q8_0(w):
    """Nearest Q8_0-representable tensor; d*q is exact in fp32 (11 + 7 significant bits) and
    re-quantizing a snapped tensor returns the same (d, q) (its block max has |q| = 127)."""
    return q8_0_dequantize(*q8_0_quantize(w))


def q8_0_bytes(w):
    """Q8_0 blocks of w, or None when w is not exactly on the Q8_0 grid (never export lossily)."""
    d16, q = q8_0_quantize(w)
    if not torch.equal(q8_0_dequantize(d16, q), w):
        return None
    nb = d16.numel()
    blocks = torch.cat([d16.reshape(nb, 1).contiguous().view(torch.uint8),
                        q.reshape(nb, 32).contiguous().view(torch.uint8)], dim=1)  # [nb, 34]
    return bytes(blocks.flatten().tolist())


# ---- randomisation -------------------------------------------------------------------------------
def randomise_trunk(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):          # gated norm: plain weight
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:                                   # zero-centred
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("A_log"):                           # decay rates 0.05 .. 5
                p.copy_(torch.empty(p.shape).uniform_(0.05, 5.0, generator=gen).log())
            elif p.dim() == 2:
                p.copy_(snap_q8_0(p.float()))
            # conv1d weight [C, 1, 4] keeps HF's random init (stored F32)


def make_mtp_params(gen):
    """HF-named MTP parameters (mtp.*), random; 2-D weights on the Q8_0 grid."""
    def lin(o, i):
        return snap_q8_0(0.02 * torch.randn(o, i, generator=gen))

    def znorm(n):
        return 0.2 * torch.randn(n, generator=gen)

    p = {
        "mtp.fc.weight": lin(H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": znorm(H),
        "mtp.pre_fc_norm_hidden.weight": znorm(H),
        "mtp.norm.weight": znorm(H),
        "mtp.layers.0.input_layernorm.weight": znorm(H),
        "mtp.layers.0.post_attention_layernorm.weight": znorm(H),
        "mtp.layers.0.self_attn.q_proj.weight": lin(NH * HD * 2, H),
        "mtp.layers.0.self_attn.k_proj.weight": lin(NKV * HD, H),
        "mtp.layers.0.self_attn.v_proj.weight": lin(NKV * HD, H),
        "mtp.layers.0.self_attn.o_proj.weight": lin(H, NH * HD),
        "mtp.layers.0.self_attn.q_norm.weight": znorm(HD),
        "mtp.layers.0.self_attn.k_norm.weight": znorm(HD),
        "mtp.layers.0.mlp.gate_proj.weight": lin(FF, H),
        "mtp.layers.0.mlp.up_proj.weight": lin(FF, H),
        "mtp.layers.0.mlp.down_proj.weight": lin(H, FF),
    }
    return p


# ---- own implementation of the gated-attention decoder layer and MTP (§6, §7, §8.2) ---------------
def rms(x, mult):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * mult


def rope(x, pos):
    """NeoX rotation of the first ROT dims of every head. x [T, heads, HD], pos [T] int."""
    inv = 1.0 / (THETA ** (torch.arange(0, ROT, 2, dtype=torch.float) / ROT))
    ang = pos.float()[:, None] * inv[None, :]                   # [T, ROT/2]
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    x1, x2 = x[..., :ROT // 2], x[..., ROT // 2:ROT]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., ROT:]], dim=-1)


class KvCache:
    def __init__(self):
        self.k = torch.zeros(0, NKV, HD)
        self.v = torch.zeros(0, NKV, HD)
        self.pos = torch.zeros(0, dtype=torch.long)


def attn_decoder_layer(P, pre, x, pos, cache=None):
    """HF-layout weights P[pre + name]; x [T, H]; pos [T] long. With `cache` the new K/V are
    appended and attention covers cached + new entries (causal by position)."""
    T = x.shape[0]
    a = rms(x, 1 + P[pre + "input_layernorm.weight"])
    qg = (a @ P[pre + "self_attn.q_proj.weight"].T).view(T, NH, 2 * HD)
    q, gate = qg[..., :HD], qg[..., HD:].reshape(T, NH * HD)   # per-head [query | gate]
    q = rms(q, 1 + P[pre + "self_attn.q_norm.weight"])
    k = rms((a @ P[pre + "self_attn.k_proj.weight"].T).view(T, NKV, HD),
            1 + P[pre + "self_attn.k_norm.weight"])
    v = (a @ P[pre + "self_attn.v_proj.weight"].T).view(T, NKV, HD)
    q, k = rope(q, pos), rope(k, pos)
    if cache is not None:
        cache.k = torch.cat([cache.k, k])
        cache.v = torch.cat([cache.v, v])
        cache.pos = torch.cat([cache.pos, pos])
        K, Vv, kpos = cache.k, cache.v, cache.pos
    else:
        K, Vv, kpos = k, v, pos
    allowed = kpos[None, :] <= pos[:, None]                      # [T, n_kv_tokens]
    outs = []
    for h in range(NH):
        kv = h // (NH // NKV)
        sc = (q[:, h] @ K[:, kv].T) * HD ** -0.5
        sc = sc.masked_fill(~allowed, float("-inf"))
        outs.append(torch.softmax(sc, dim=-1) @ Vv[:, kv])
    o = torch.stack(outs, 1).reshape(T, NH * HD) * torch.sigmoid(gate)
    x = x + o @ P[pre + "self_attn.o_proj.weight"].T
    f = rms(x, 1 + P[pre + "post_attention_layernorm.weight"])
    mlp = (F.silu(f @ P[pre + "mlp.gate_proj.weight"].T) * (f @ P[pre + "mlp.up_proj.weight"].T))
    return x + mlp @ P[pre + "mlp.down_proj.weight"].T


def mtp_forward(P, embed, lm_head, tokens, hidden, pos, cache):
    """§8.2 for a batch of slots. tokens [T] long, hidden [T, H] (final-normed), pos [T] long.
    Returns (logits [T, V], h' [T, H])."""
    e = rms(embed[tokens], 1 + P["mtp.pre_fc_norm_embedding.weight"])
    hh = rms(hidden, 1 + P["mtp.pre_fc_norm_hidden.weight"])
    u = torch.cat([e, hh], dim=-1) @ P["mtp.fc.weight"].T        # embedding half first
    u = attn_decoder_layer(P, "mtp.layers.0.", u, pos, cache)
    hp = rms(u, 1 + P["mtp.norm.weight"])
    return hp @ lm_head.T, hp


# ---- GGUF export (§9.6) ---------------------------------------------------------------------------
def to_tiled(t, dim, hd):
    """HF grouped value-head order -> GGUF tiled order along `dim` (heads of size hd)."""
    s = list(t.shape)
    t = t.reshape(s[:dim] + [NK, R, hd] + s[dim + 1:])
    return t.transpose(dim, dim + 1).reshape(s)


def gguf_tensors(sd, mtp):
    """[(gguf name, tensor in PyTorch layout, i.e. reversed ggml ne)] in llama.cpp's conventions."""
    out = [("token_embd.weight", sd["model.embed_tokens.weight"]),
           ("output_norm.weight", sd["model.norm.weight"] + 1),
           ("output.weight", sd["lm_head.weight"])]

    def common(i, src, pre):
        return [(f"blk.{i}.attn_norm.weight", src[pre + "input_layernorm.weight"] + 1),
                (f"blk.{i}.post_attention_norm.weight", src[pre + "post_attention_layernorm.weight"] + 1),
                (f"blk.{i}.ffn_gate.weight", src[pre + "mlp.gate_proj.weight"]),
                (f"blk.{i}.ffn_up.weight", src[pre + "mlp.up_proj.weight"]),
                (f"blk.{i}.ffn_down.weight", src[pre + "mlp.down_proj.weight"])]

    def attention(i, src, pre):
        a = pre + "self_attn."
        return [(f"blk.{i}.attn_q.weight", src[a + "q_proj.weight"]),
                (f"blk.{i}.attn_k.weight", src[a + "k_proj.weight"]),
                (f"blk.{i}.attn_v.weight", src[a + "v_proj.weight"]),
                (f"blk.{i}.attn_output.weight", src[a + "o_proj.weight"]),
                (f"blk.{i}.attn_q_norm.weight", src[a + "q_norm.weight"] + 1),
                (f"blk.{i}.attn_k_norm.weight", src[a + "k_norm.weight"] + 1)]

    kk = 2 * NK * DK
    for i in range(N_LAYER):
        pre = f"model.layers.{i}."
        out += common(i, sd, pre)
        if is_attention(i):
            out += attention(i, sd, pre)
            continue
        a = pre + "linear_attn."
        qkv = sd[a + "in_proj_qkv.weight"]
        conv = sd[a + "conv1d.weight"].squeeze(1)                  # [C, 1, 4] -> [C, 4]
        out += [
            (f"blk.{i}.attn_qkv.weight", torch.cat([qkv[:kk], to_tiled(qkv[kk:], 0, DV)])),
            (f"blk.{i}.attn_gate.weight", to_tiled(sd[a + "in_proj_z.weight"], 0, DV)),
            (f"blk.{i}.ssm_beta.weight", to_tiled(sd[a + "in_proj_b.weight"], 0, 1)),
            (f"blk.{i}.ssm_alpha.weight", to_tiled(sd[a + "in_proj_a.weight"], 0, 1)),
            (f"blk.{i}.ssm_dt.bias", to_tiled(sd[a + "dt_bias"], 0, 1)),
            (f"blk.{i}.ssm_a", to_tiled(-torch.exp(sd[a + "A_log"].float()), 0, 1)),
            (f"blk.{i}.ssm_conv1d.weight", torch.cat([conv[:kk], to_tiled(conv[kk:], 0, DV)])),
            (f"blk.{i}.ssm_norm.weight", sd[a + "norm.weight"]),      # no +1
            (f"blk.{i}.ssm_out.weight", to_tiled(sd[a + "out_proj.weight"], 1, DV)),
        ]
    m = MTP_IDX
    out += common(m, mtp, "mtp.layers.0.")
    out += attention(m, mtp, "mtp.layers.0.")
    out += [(f"blk.{m}.nextn.eh_proj.weight", mtp["mtp.fc.weight"]),
            (f"blk.{m}.nextn.enorm.weight", mtp["mtp.pre_fc_norm_embedding.weight"] + 1),
            (f"blk.{m}.nextn.hnorm.weight", mtp["mtp.pre_fc_norm_hidden.weight"] + 1),
            (f"blk.{m}.nextn.shared_head_norm.weight", mtp["mtp.norm.weight"] + 1)]
    return out


def write_gguf(path, tensors, all_f32):
    w = gw.GGUFWriter(alignment=32)
    A = "qwen35"
    w.add_string("general.architecture", A)
    w.add_string("general.name", "deltaserve tiny reference (random weights)")
    w.add_u32("general.alignment", 32)  # explicit, as requested; equal to the default
    w.add_u32("general.file_type", 0 if all_f32 else 7)   # llama_ftype ALL_F32 / MOSTLY_Q8_0
    w.add_u32("general.quantization_version", 2)
    w.add_u32(A + ".block_count", N_LAYER + 1)
    w.add_u32(A + ".context_length", CTX)
    w.add_u32(A + ".embedding_length", H)
    w.add_u32(A + ".feed_forward_length", FF)
    w.add_u32(A + ".attention.head_count", NH)
    w.add_u32(A + ".attention.head_count_kv", NKV)
    w.add_u32(A + ".attention.key_length", HD)
    w.add_u32(A + ".attention.value_length", HD)
    w.add_f32(A + ".attention.layer_norm_rms_epsilon", EPS)
    w.add_f32(A + ".rope.freq_base", THETA)
    w.add_u32(A + ".rope.dimension_count", ROT)
    w.add_array(A + ".rope.dimension_sections", gw.I32, MROPE + [0])
    w.add_u32(A + ".ssm.conv_kernel", CONV)
    w.add_u32(A + ".ssm.state_size", DK)
    w.add_u32(A + ".ssm.group_count", NK)
    w.add_u32(A + ".ssm.time_step_rank", NV)
    w.add_u32(A + ".ssm.inner_size", NV * DV)
    w.add_u32(A + ".full_attention_interval", 4)
    w.add_u32(A + ".nextn_predict_layers", 1)
    w.add_u32(A + ".vocab_size", VOCAB)
    w.add_string("tokenizer.ggml.model", "none")
    n_q8 = 0
    for name, t in tensors:
        t = t.detach().float().contiguous()
        ne = list(reversed(t.shape))
        blocks = None
        if t.dim() == 2 and not name.endswith("ssm_conv1d.weight") and not all_f32:
            blocks = q8_0_bytes(t)
            if blocks is None:
                print("WARNING: %s is not on the Q8_0 grid, stored as F32" % name)
        if blocks is not None:
            w.add_tensor(name, ne, gw.GGML_Q8_0, blocks)
            n_q8 += 1
        else:
            w.add_tensor_f32(name, ne, t.flatten().tolist())
    size = w.write(path)
    return size, n_q8


# ---- outputs ---------------------------------------------------------------------------------------
class Blob:
    """Concatenated little-endian float32 arrays; returns {offset (bytes), shape} descriptors."""

    def __init__(self):
        self.data = array("f")

    def add(self, t):
        t = t.detach().float().contiguous()
        desc = {"offset": 4 * len(self.data), "shape": list(t.shape), "dtype": "f32"}
        self.data.extend(t.flatten().tolist())
        return desc


def max_abs(a, b):
    return float((a - b).abs().max()) if a.numel() else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=20260521)
    ap.add_argument("--f32", action="store_true",
                    help="store 2-D weights as F32 (~24 MB) instead of lossless Q8_0 (~6 MB)")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    import transformers
    from transformers import Qwen3_5ForCausalLM
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    cfg = build_config()
    model = Qwen3_5ForCausalLM(cfg).float().eval()
    randomise_trunk(model, gen)
    mtp = make_mtp_params(gen)
    sd = {k: v.detach().clone().float() for k, v in model.state_dict().items()}
    embed, lm_head = sd["model.embed_tokens.weight"], sd["lm_head.weight"]
    report = {"transformers": transformers.__version__, "torch": torch.__version__}
    print("transformers", transformers.__version__, "torch", torch.__version__)

    prompt_gen = torch.Generator().manual_seed(args.seed + 1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=prompt_gen) for n in PROMPT_LENS]

    # Hooks: the final norm's output is by definition the final-normed hidden state (§2 step 3);
    # the input/output of attention layer 3 validate our own decoder layer used by the MTP block.
    cap = {}
    hooks = [model.model.norm.register_forward_hook(
        lambda mod, inp, out: cap.__setitem__("hn", out.detach().clone()))]

    def layer_hook(mod, args_, kwargs, out):
        x = args_[0] if args_ else kwargs["hidden_states"]
        cap["l3_in"] = x.detach().clone()
        cap["l3_out"] = (out[0] if isinstance(out, (tuple, list)) else out).detach().clone()
        cap["l3_kwargs"] = {k: v for k, v in kwargs.items() if k != "hidden_states"}
    hooks.append(model.model.layers[3].register_forward_hook(layer_hook, with_kwargs=True))

    blob = Blob()
    out_prompts = []
    sanity = {"prefill_vs_decode_max_abs": [], "lm_head_of_hook_vs_logits_max_abs": [],
              "own_attention_layer_vs_hf_layer3_max_abs": [], "mtp_sequential_vs_batched_max_abs": []}
    hidden_states_last_is_post_norm = None
    mtp_vs_hf_class = None
    with torch.no_grad():
        for pi, ids in enumerate(prompts):
            T = ids.numel()
            # (a) prefill
            cap.clear()
            out = model(input_ids=ids[None], use_cache=False, output_hidden_states=True)
            logits = out.logits[0].float()                      # [T, V]
            hn = cap["hn"][0].float()                           # [T, H]
            sanity["lm_head_of_hook_vs_logits_max_abs"].append(max_abs(hn @ lm_head.T, logits))
            if out.hidden_states is not None:
                last = out.hidden_states[-1][0].float()
                post = bool(torch.allclose(last, hn, atol=1e-6, rtol=0))
                hidden_states_last_is_post_norm = post if hidden_states_last_is_post_norm is None \
                    else (hidden_states_last_is_post_norm and post)
            pos = torch.arange(T)
            if "l3_in" in cap:
                own = attn_decoder_layer(sd, "model.layers.3.", cap["l3_in"][0].float(), pos)
                d = max_abs(own, cap["l3_out"][0].float())
            else:
                d = 1e30  # hook did not fire: counts as a failure below
                print("WARNING: layer-3 hook captured nothing")
            sanity["own_attention_layer_vs_hf_layer3_max_abs"].append(d)
            l3_kwargs = cap.get("l3_kwargs", {})

            # (b) token-by-token decode through HF's cache
            past = None
            dec = []
            for t in range(T):
                o = model(input_ids=ids[None, t:t + 1], past_key_values=past, use_cache=True)
                past = o.past_key_values
                if past is None:
                    raise RuntimeError("HF returned no cache with use_cache=True")
                dec.append(o.logits[0, -1].float())
            dec = torch.stack(dec)
            sanity["prefill_vs_decode_max_abs"].append(max_abs(dec, logits))

            # (c) MTP: slots 0..T-1 over the prompt, then N_DRAFT recursive drafts (§8.3)
            next_tok = int(torch.argmax(logits[T - 1]))
            cache = KvCache()
            m_tok, m_hsrc, m_logits, m_hidden = [], [], [], []
            for s in range(T + N_DRAFT):
                if s < T:
                    tok = int(ids[s + 1]) if s + 1 < T else next_tok
                    h_in, src = hn[s], "main"
                else:
                    tok = int(torch.argmax(m_logits[-1]))
                    h_in, src = m_hidden[-1], "draft"
                lg, hp = mtp_forward(mtp, embed, lm_head, torch.tensor([tok]), h_in[None],
                                     torch.tensor([s]), cache)
                m_tok.append(tok)
                m_hsrc.append(src)
                m_logits.append(lg[0])
                m_hidden.append(hp[0])
            m_logits_t, m_hidden_t = torch.stack(m_logits), torch.stack(m_hidden)
            # The same first T slots in one causal batch (no cache) must agree.
            lg_b, _ = mtp_forward(mtp, embed, lm_head, torch.tensor(m_tok[:T]), hn, pos, None)
            sanity["mtp_sequential_vs_batched_max_abs"].append(max_abs(lg_b, m_logits_t[:T]))

            # Cross-check the MTP decoder layer with HF's own class (full-attention config), using
            # the call arguments HF passed to layer 3 for this very sequence length.
            if T > 1 and mtp_vs_hf_class is None:
                try:
                    layer_cls = type(model.model.layers[3])
                    hf_layer = layer_cls(cfg, 3).float().eval()
                    pre = "mtp.layers.0."
                    hf_layer.load_state_dict({k[len(pre):]: v for k, v in mtp.items()
                                              if k.startswith(pre)}, strict=True)
                    u = torch.randn(1, T, H, generator=gen)
                    y = hf_layer(u, **l3_kwargs)
                    y = y[0] if isinstance(y, (tuple, list)) else y
                    mine = attn_decoder_layer(mtp, pre, u[0], pos)
                    mtp_vs_hf_class = max_abs(mine, y[0])
                except Exception as e:  # informational only; our layer is validated on layer 3
                    mtp_vs_hf_class = "not run: %s: %s" % (type(e).__name__, e)

            out_prompts.append({
                "tokens": [int(x) for x in ids],
                "prefill_logits": blob.add(logits),
                "decode_logits": blob.add(dec),
                "hidden": blob.add(hn),
                "mtp": {
                    "tokens": m_tok,
                    "positions": list(range(T + N_DRAFT)),
                    "hidden_from": m_hsrc,
                    "logits": blob.add(m_logits_t),
                    "hidden_out": blob.add(m_hidden_t),
                },
                "greedy_next_token": next_tok,
            })
            print("prompt %d: T=%3d  max|prefill-decode|=%.3g  logit scale %.3g  "
                  "own-layer-vs-HF %.3g  mtp seq-vs-batch %.3g"
                  % (pi, T, sanity["prefill_vs_decode_max_abs"][-1], float(logits.abs().max()),
                     sanity["own_attention_layer_vs_hf_layer3_max_abs"][-1],
                     sanity["mtp_sequential_vs_batched_max_abs"][-1]))
    for h in hooks:
        h.remove()

    # Checked after writing (so a failing run can still be inspected), exit status 1 on failure.
    worst = {k: max(v) for k, v in sanity.items()}
    print("sanity (worst over prompts):", json.dumps(worst))
    limits = {"prefill_vs_decode_max_abs": 1e-4, "lm_head_of_hook_vs_logits_max_abs": 1e-5,
              "own_attention_layer_vs_hf_layer3_max_abs": 1e-5,
              "mtp_sequential_vs_batched_max_abs": 1e-5}
    failures = ["%s = %.3g >= %.0e" % (k, worst[k], lim) for k, lim in limits.items()
                if not worst[k] < lim]
    print("MTP layer (own) vs HF Qwen3_5DecoderLayer class, same weights:", mtp_vs_hf_class)

    tensors = gguf_tensors(sd, mtp)
    gguf_path = os.path.join(args.out_dir, "tiny_ref.gguf")
    size, n_q8 = write_gguf(gguf_path, tensors, args.f32)
    print("wrote %s: %d tensors (%d Q8_0), %.2f MB" % (gguf_path, len(tensors), n_q8, size / 1e6))

    bin_path = os.path.join(args.out_dir, "reference.bin")
    with open(bin_path, "wb") as f:
        blob.data.tofile(f)
    ref = {
        "format": 1,
        "description": "HF Qwen3_5ForCausalLM fp32 reference for tiny_ref.gguf; see README.md",
        "gguf": "tiny_ref.gguf",
        "bin": "reference.bin",
        "bin_layout": "little-endian float32; offsets in bytes; shapes row-major",
        "seed": args.seed,
        "versions": report,
        "weights_stored_as": "F32" if args.f32 else "Q8_0 (lossless: weights snapped to the Q8_0 grid)",
        "hidden_source": ("output of model.model.norm captured with a forward hook (final-normed); "
                          "output_hidden_states[-1] %s"
                          % ("equals it (post-norm)" if hidden_states_last_is_post_norm
                             else "differs from it (pre-norm)" if hidden_states_last_is_post_norm is False
                             else "was not returned")),
        "hidden_states_last_is_post_norm": hidden_states_last_is_post_norm,
        "mtp_convention": ("slot s < T pairs token x_{s+1} (x_T = greedy_next_token) with the main "
                           "hidden h_s at position s; slots s >= T are drafts: token = argmax of the "
                           "previous slot's MTP logits, hidden = the previous slot's MTP h', "
                           "position s. One MTP KV cache per prompt, starting empty."),
        "config": {
            "n_layer": N_LAYER, "block_count": N_LAYER + 1, "nextn_predict_layers": 1,
            "n_embd": H, "n_ff": FF, "n_vocab": VOCAB, "n_head": NH, "n_head_kv": NKV,
            "head_dim": HD, "n_rot": ROT, "rope_base": THETA, "mrope_sections": MROPE + [0],
            "rms_eps": EPS, "conv_kernel": CONV, "gdn_k_heads": NK, "gdn_v_heads": NV,
            "gdn_k_dim": DK, "gdn_v_dim": DV, "context_length": CTX,
            "recurrent_layers": [not is_attention(i) for i in range(N_LAYER)],
            "n_draft": N_DRAFT,
        },
        "sanity": {k: v for k, v in sanity.items()},
        "mtp_layer_vs_hf_class_max_abs": mtp_vs_hf_class,
        "prompts": out_prompts,
    }
    with open(os.path.join(args.out_dir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    total = size + 4 * len(blob.data) + os.path.getsize(os.path.join(args.out_dir, "reference.json"))
    print("wrote %s and reference.json; total %.2f MB" % (bin_path, total / 1e6))
    if failures:
        print("SANITY FAILED (do not commit these files):", "; ".join(failures))
        sys.exit(1)
    print("all sanity checks passed")


if __name__ == "__main__":
    main()
