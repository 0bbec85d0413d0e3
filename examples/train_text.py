#!/usr/bin/python3
"""Data-parallel training of a small GPT-style byte-level language model on real English
text (the licence texts under /usr/share/common-licenses; the last 10% of the bytes held
out), through the gcomp-ps parameter server.

    /usr/bin/python3 examples/train_text.py --mode near-lossless --workers 2 --shards 2

Ends with one JSON line: mode, steps, train_loss, test_loss (mean cross-entropy in nats per
byte on the held-out text), raw_bytes, wire_bytes, ratio, seconds, transport (ps or gloo:
the one it ran on).
"""
import glob
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

TEXT_GLOB = os.environ.get("GCOMP_TEXT_GLOB", "/usr/share/common-licenses/*")
CONTEXT = 64


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        y = self.ln1(x)
        x = x + self.att(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Pre-norm decoder-only transformer over bytes: 2 layers, d=128, 4 heads (0.44 M params)."""

    def __init__(self, vocab=256, d=128, layers=2, heads=4, ctx=CONTEXT):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), 1)
        x = self.emb(idx) + self.pos(torch.arange(t))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def load_text(pattern=TEXT_GLOB):
    """Bytes of every distinct file matching `pattern` (symlinked duplicates once), sorted."""
    seen, data = set(), b""
    for path in sorted(glob.glob(pattern)):
        real = os.path.realpath(path)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        with open(real, "rb") as f:
            data += f.read()
    if len(data) < 20 * CONTEXT:
        raise SystemExit("not enough text under %s" % pattern)
    return torch.tensor(list(data), dtype=torch.long)


class TextTask:
    def __init__(self):
        self._data = None

    def data(self):
        if self._data is None:
            data = load_text()
            cut = int(len(data) * 0.9)
            self._data = (data[:cut], data[cut:])
        return self._data

    def build_model(self):
        return TinyGPT()

    def make_optimizer(self, model, lr):
        return torch.optim.Adam(model.parameters(), lr=lr)

    def loss(self, logits, y):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def train_batch(self, seed, step, rank, world, batch):
        train, _ = self.data()
        starts = common.global_batch_indices(seed, step, len(train) - CONTEXT - 1, batch)
        per = batch // world
        mine = starts[rank * per:(rank + 1) * per]
        s = torch.stack([train[j:j + CONTEXT + 1] for j in mine])
        return s[:, :-1], s[:, 1:]

    def evaluate(self, model, max_windows=256):
        _, test = self.data()
        n = min(max_windows, (len(test) - 1) // CONTEXT)
        s = torch.stack([test[i * CONTEXT:i * CONTEXT + CONTEXT + 1] for i in range(n)])
        total = 0.0
        for chunk in s.split(64):
            logits = model(chunk[:, :-1])
            total += float(F.cross_entropy(logits.reshape(-1, 256), chunk[:, 1:].reshape(-1),
                                           reduction="sum"))
        return {"test_loss": round(total / (n * CONTEXT), 6)}


# 6 mantissa bits: text gradients have few zeros and a wide exponent spread, so R = 7
# leaves the ratio at about 3x; R = 6 bounds the error at 2^-7 of each element.
DEFAULTS = {"steps": 150, "batch": 16, "lr": 2e-3, "rel_bits": 6}

if __name__ == "__main__":
    common.main(TextTask(), __doc__.splitlines()[0], DEFAULTS, os.path.abspath(__file__))
