"""FlashInfer's documented plan()/run() contract in plain torch, standing in for its CUDA kernels.

The masks are FlashInfer's: causal, with the queries the last rows of each sequence's context,
and `window_left` keys to the left of each query (-1 = none). Every plan() call is recorded, so a
test can count how often the backend plans.
"""

import torch


class ReferenceWrapper:
    """FlashInfer's plan()/run() contract in plain torch; records every plan() call."""

    def __init__(self, decode):
        self.decode, self.plans = decode, []

    def plan(self, *args, **options):
        self.plans.append((args, options))
        if self.decode:
            indptr, indices, last, num_heads, num_kv_heads, head_dim, page_size = args
            qo_indptr = torch.arange(len(last) + 1)
        else:
            qo_indptr, indptr, indices, last, num_heads, num_kv_heads, head_dim, page_size = args
            assert options["causal"]
        self.state = (
            qo_indptr.tolist(),
            indptr.tolist(),
            indices,
            last.tolist(),
            num_heads // num_kv_heads,
            page_size,
            options,
        )

    def run(self, q, kv_cache):
        qo_indptr, indptr, indices, last, group, page_size, options = self.state
        k_cache, v_cache = kv_cache
        assert k_cache.shape[1] == page_size and q.shape[0] == qo_indptr[-1]
        out = torch.empty_like(q)
        for b in range(len(last)):
            pages = indices[indptr[b] : indptr[b + 1]].long()
            kv_len = (len(pages) - 1) * page_size + last[b]
            k = k_cache[pages].flatten(0, 1)[:kv_len].float().repeat_interleave(group, dim=1)
            v = v_cache[pages].flatten(0, 1)[:kv_len].float().repeat_interleave(group, dim=1)
            rows = q[qo_indptr[b] : qo_indptr[b + 1]].float()
            qo_idx = torch.arange(len(rows))[:, None]
            kv_idx = torch.arange(kv_len)[None, :]
            visible = kv_idx + len(rows) <= kv_len + qo_idx
            if options["window_left"] >= 0:
                visible &= kv_idx + len(rows) + options["window_left"] >= kv_len + qo_idx
            scores = torch.einsum("qhd,khd->hqk", rows, k) * options["sm_scale"]
            probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
            out[qo_indptr[b] : qo_indptr[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
        return out


class ReferenceFactory:
    """What FlashInferBackend calls to make a wrapper: one ReferenceWrapper per call, kept."""

    def __init__(self):
        self.wrappers = []

    def __call__(self, decode, device):
        self.wrappers.append(ReferenceWrapper(decode))
        return self.wrappers[-1]

    @property
    def plan_count(self):
        return sum(len(w.plans) for w in self.wrappers)
