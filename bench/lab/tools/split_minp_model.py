"""CPU only: for min-p rows on the split launch (patches/s20_split_minp.patch), how many of the S
chunks hold a kept token (phase 2 reads those again with one CTA), for the bench's rows and flat
ones, at S = 148 / 33 / 8 chunks per row (B = 1 / 16 / 64 on 132 SMs; 256 rows each).

    python bench/lab/tools/split_minp_model.py
"""
import math

import torch

V = 151936
for (T, mp, scale, name) in ((0.8,0.1,4.0,"randn*4 T=0.8 mp=0.1"),(0.8,0.01,4.0,"randn*4 T=0.8 mp=0.01"),(0.05,0.1,4.0,"T=0.05"),(1.0,0.05,1.0,"flat randn*1 T=1 mp=0.05"),(2.0,0.01,1.0,"flat T=2 mp=0.01")):
  for S in (148, 33, 8):
    g=torch.Generator().manual_seed(0)
    z=torch.randn(256,V,generator=g)*scale
    chunk=((V+S-1)//S+7)//8*8
    zmax=z.max(1,keepdim=True).values
    y=(z-zmax)/T
    kept=(y>=math.log(mp))
    nk=kept.sum(1).float()
    pad=chunk*S-V
    kp=torch.nn.functional.pad(kept,(0,pad)).view(256,S,chunk).any(2).sum(1).float()
    print(f"{name:28s} S={S:3d}: kept tokens median {nk.median():.0f} max {nk.max():.0f}; chunks listed median {kp.median():.0f} max {kp.max():.0f} of {S} (elements read again: {kp.median()*chunk:.0f})")
