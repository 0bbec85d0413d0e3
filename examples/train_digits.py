#!/usr/bin/python3
"""Data-parallel training of a CNN on scikit-learn's 8x8 handwritten digits (1,797 real
images, 30% held out, stratified), through the gcomp-ps parameter server.

    /usr/bin/python3 examples/train_digits.py --mode near-lossless --workers 2 --shards 2

Ends with one JSON line: mode, steps, train_loss, test_accuracy (a fraction), raw_bytes,
wire_bytes, ratio, seconds, transport (ps or gloo: the one it ran on).
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class DigitsCNN(nn.Module):
    """2 conv + 2 linear layers, 1.13 M parameters (the model of the shared gradients)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 64, 3, padding=1)
        self.c2 = nn.Conv2d(64, 128, 3, padding=1)
        self.f1 = nn.Linear(128 * 16, 512)
        self.f2 = nn.Linear(512, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.relu(self.c2(x))
        x = F.adaptive_avg_pool2d(x, 4).flatten(1)
        return self.f2(F.relu(self.f1(x)))


class DigitsTask:
    def __init__(self):
        self._data = None

    def data(self):
        if self._data is None:
            from sklearn.datasets import load_digits
            from sklearn.model_selection import train_test_split
            d = load_digits()
            x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
            y = torch.tensor(d.target)
            idx_train, idx_test = train_test_split(
                range(len(y)), test_size=0.3, random_state=0, stratify=d.target)
            self._data = (x[idx_train], y[idx_train], x[idx_test], y[idx_test])
        return self._data

    def build_model(self):
        return DigitsCNN()

    def make_optimizer(self, model, lr):
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def loss(self, logits, y):
        return F.cross_entropy(logits, y)

    def train_batch(self, seed, step, rank, world, batch):
        xtr, ytr, _, _ = self.data()
        idx = common.global_batch_indices(seed, step, len(ytr), batch)
        per = batch // world
        mine = torch.as_tensor(idx[rank * per:(rank + 1) * per])
        return xtr[mine], ytr[mine]

    def evaluate(self, model):
        _, _, xte, yte = self.data()
        pred = model(xte).argmax(1)
        return {"test_accuracy": round(float((pred == yte).float().mean()), 6)}


DEFAULTS = {"steps": 200, "batch": 64, "lr": 0.05}

if __name__ == "__main__":
    common.main(DigitsTask(), __doc__.splitlines()[0], DEFAULTS, os.path.abspath(__file__))
