"""A byte-level GPT-style language model (pre-LayerNorm decoder, learned positions, GELU MLP of
4x the width), written for this experiment. Each transformer block is one Prism block
(`model.blocks`); the byte embedding, the position embedding and the final LayerNorm + head are
not blocks (with 256 symbols they are 2.5% of the parameters of the experiment's model)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256


class Block(nn.Module):
    """x + attn(ln1(x)), then + mlp(ln2(x)): causal multi-head self-attention and a GELU MLP."""

    def __init__(self, width, heads):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d // self.heads))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Bytes in, next-byte logits out. forward(x, y) returns the mean cross-entropy (nats per
    byte, computed in FP32) when targets y are given, else the logits."""

    def __init__(self, layers, width, heads, context):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        # GPT-2's initialisation: N(0, 0.02), the projections into the residual stream scaled by
        # 1/sqrt(2 * layers), biases 0.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, x, y=None):
        t = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.ln_f(h))
        if y is None:
            return logits
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
