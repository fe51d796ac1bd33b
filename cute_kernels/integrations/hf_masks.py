"""The Transformers integration's masks (:mod:`cute_kernels.integrations.hf` describes the routing):
the ``AttentionMaskInterface`` entry :func:`mask_function` (no mask, or the 2-D padding slice, for the
causal patterns the kernels take), the packed form of a padded batch (:func:`unpad_metadata`,
reused per mask object across a forward pass's layers) and the explicit masks a fallback gets where
its own masking would differ from the kernels' (causal bands, packed sequences, padding)."""

from __future__ import annotations

from typing import NamedTuple

import torch


# --------------------------------------------------------------------------------------------- mask
def _no_padding(attention_mask) -> bool | None:
    """True: no 2-D mask or all ones; False: some padding; None: cannot tell (tracing)."""
    if attention_mask is None:
        return True
    from transformers.utils.import_utils import is_tracing

    if is_tracing(attention_mask):
        return None
    return bool(attention_mask.all())


def _same_function(a, b) -> bool:
    """``a`` and ``b`` are the same function or closures of the same code over equal values (HF's mask
    factories make a new closure per call)."""
    if a is b:
        return True
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if code_a is None or code_a is not code_b:
        return False
    cells_a, cells_b = a.__closure__ or (), b.__closure__ or ()
    if len(cells_a) != len(cells_b):
        return False
    try:
        return all(_same_value(x.cell_contents, y.cell_contents) for x, y in zip(cells_a, cells_b))
    except ValueError:  # an empty cell
        return False


def _same_value(a, b) -> bool:
    if callable(a) or callable(b):
        return _same_function(a, b)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return type(a) is type(b) and a == b
    return False


def _kernel_pattern(fn, local_size) -> bool:
    """The mask function is one the attention function applies itself: plain causal (no local size)
    or HF's sliding-window causal of width ``local_size``."""
    from transformers import masking_utils as mu

    if fn is mu.causal_mask_function:
        return local_size is None
    if isinstance(local_size, int) and not isinstance(local_size, bool) and local_size > 0:
        return _same_function(fn, mu.sliding_window_causal_mask_function(local_size))
    return False


def mask_function(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                  mask_function=None, attention_mask=None, local_size=None, **kwargs):
    """The ``AttentionMaskInterface`` entry.  For a plain causal or sliding-window causal pattern: None
    without padding over the layer's keys, else the (B, <= kv_length) boolean slice of the 2-D mask
    over them (its last ``kv_length`` columns); for anything else (or under tracing) HF's dense sdpa
    mask (boolean, (B, 1, q_length, kv_length)), which makes the attention function fall back."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):  # .all() would raise AttributeError
        raise TypeError(f"mask_function: attention_mask must be a torch.Tensor or None, got "
                        f"{type(attention_mask).__name__}")
    if mask_function is not None and not callable(mask_function):
        raise TypeError(f"mask_function: mask_function must be callable or None, got {type(mask_function).__name__}")
    fn = causal_mask_function if mask_function is None else mask_function
    if _kernel_pattern(fn, local_size):
        if attention_mask is None:
            return None
        if attention_mask.dim() == 2:
            seen = attention_mask[:, -kv_length:] if kv_length > 0 else attention_mask[:, :0]
            none = _no_padding(seen)
            if none:
                return None
            if none is False:
                return seen if seen.dtype == torch.bool else seen != 0
    kwargs.pop("allow_is_causal_skip", None)
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=fn, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=False, **kwargs)


# -------------------------------------------------------------------------------------------- unpad
class Unpad(NamedTuple):
    """Packed-sequence form of a padded batch (:func:`unpad_metadata`), on the mask's device."""

    cu_seqlens_q: torch.Tensor  #: (B + 1,) int32: the valid queries of sequence b are packed rows cu[b]..cu[b+1]-1
    cu_seqlens_k: torch.Tensor  #: (B + 1,) int32, the same for the valid keys
    max_seqlen_q: int
    max_seqlen_k: int
    q_index: tuple  #: (batch, query row) int64 tensors of the valid queries, packed order
    k_index: tuple  #: (batch, key column) int64 tensors of the valid keys, packed order
    total_q: int
    all_queries: bool  #: every query row valid: the packed output is the padded one, reshaped
    one_run: bool  #: every sequence's valid keys are consecutive columns (a window is exact packed)


def unpad_metadata(mask: torch.Tensor, q_len: int) -> Unpad:
    """The packed form of a batch whose keys are the columns of ``mask`` ((B, n), nonzero = a real
    token) and whose ``q_len`` queries are its last ``q_len`` columns.  One device-to-host copy of the
    mask (a synchronization) and two small host-to-device copies."""
    B, n = mask.shape
    if not 0 <= q_len <= n:
        raise ValueError(f"unpad_metadata: {q_len} queries but the mask has {n} columns")
    dev = mask.device
    h = mask.detach().to("cpu") != 0
    qm = h[:, n - q_len:]
    kl, ql = h.sum(1), qm.sum(1)
    cu = torch.zeros(2, B + 1, dtype=torch.int64)
    cu[0, 1:], cu[1, 1:] = ql.cumsum(0), kl.cumsum(0)
    ki, qi = h.nonzero(), qm.nonzero()  # row-major: sequence by sequence, columns ascending
    runs = h[:, :1].sum(1) + (h[:, 1:] & ~h[:, :-1]).sum(1)
    cu_d = cu.to(torch.int32).to(dev)
    idx = torch.cat([ki, qi]).t().contiguous().to(dev)
    nk = ki.shape[0]
    return Unpad(cu_d[0], cu_d[1], int(ql.max()) if B else 0, int(kl.max()) if B else 0,
                 (idx[0, nk:], idx[1, nk:]), (idx[0, :nk], idx[1, :nk]), int(qi.shape[0]),
                 bool((ql == q_len).all()), bool((runs <= 1).all()))


#: (mask, its version counter, q_len, Unpad): the layers of one forward pass share their mask object.
_UNPAD_CACHE: list = []
_UNPAD_KEEP = 4


def _version(t: torch.Tensor):
    try:
        return t._version
    except RuntimeError:  # an inference-mode tensor has no version counter: its identity alone
        return None


def _unpad_cached(mask: torch.Tensor, q_len: int) -> Unpad:
    """:func:`unpad_metadata`, reused while the same mask object (unchanged in place) comes back with the
    same query length: every layer of a forward pass gets the one mask its mask function built."""
    ver = _version(mask)
    for m, v, ql, meta in _UNPAD_CACHE:
        if m is mask and v == ver and ql == q_len:
            return meta
    meta = unpad_metadata(mask, q_len)
    _UNPAD_CACHE.insert(0, (mask, ver, q_len, meta))
    del _UNPAD_CACHE[_UNPAD_KEEP:]
    return meta


def _padding_mask(attention_mask, batch: int, q_len: int) -> bool:
    """A 2-D (B, n >= q_len) boolean or integer padding mask (what :func:`mask_function` returns)."""
    return (isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2
            and attention_mask.shape[0] == batch and attention_mask.shape[1] >= q_len
            and (attention_mask.dtype == torch.bool or not attention_mask.is_floating_point()))


def _fit_padding(mask: torch.Tensor, key, value):
    """Keys and mask columns matched: a static buffer's first keys (its unfilled slots follow them), any
    other key tensor's last ones (a sliding layer recording its past, transformers 5.17, returns more
    keys than the mask covers); a mask wider than the keys keeps its last columns (HF slices so)."""
    n, kv_len = mask.shape[1], key.shape[2]
    if n > kv_len:
        mask = mask[:, n - kv_len:]
    elif n < kv_len:
        start = 0 if _is_static_buffer(key) else kv_len - n
        key, value = key.narrow(2, start, n), value.narrow(2, start, n)
    return (mask if mask.dtype == torch.bool else mask != 0), key, value



def _is_static_buffer(t: torch.Tensor) -> bool:
    """HF's StaticCache marks its buffers with ``torch._dynamo.mark_static_address``."""
    return getattr(t, "_dynamo_static_input_type", None) is not None


# ----------------------------------------------------------------------------------- fallback masks
def _causal_band(kpos: torch.Tensor, last: torch.Tensor, window) -> torch.Tensor:
    """Key positions ``kpos`` a query whose last visible key is ``last`` sees (broadcast): bottom-right
    causal, and with HF's ``sliding_window`` W only the W keys ending at ``last``."""
    band = kpos <= last
    return band if window is None else band & (kpos > last - window)


def _cu_seq_lens(kwargs) -> tuple:
    """HF's packed-sequence boundaries ``(cu_seq_lens_q, cu_seq_lens_k)``, a side not given (absent or None)
    being the other's."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    return (cu_k if cu_q is None else cu_q), (cu_q if cu_k is None else cu_k)


def _packed_mask(kwargs, q_len: int, kv_len: int, causal: bool, device, window=None) -> torch.Tensor:
    """(1, 1, q_len, kv_len) boolean mask of packed sequences: query i of sequence s sees the keys of
    sequence s (bottom-right causal when ``causal``, and within ``window``); rows past the last
    sequence see nothing."""
    cu_q, cu_k = _cu_seq_lens(kwargs)
    cu_q, cu_k = cu_q.to(device=device, dtype=torch.int64), cu_k.to(device=device, dtype=torch.int64)
    qi, kj = torch.arange(q_len, device=device), torch.arange(kv_len, device=device)
    sq = torch.bucketize(qi, cu_q[1:], right=True)  # the sequence of each row (n: past the last)
    sk = torch.bucketize(kj, cu_k[1:], right=True)
    n = cu_q.numel() - 1
    sqc, skc = sq.clamp(max=max(n - 1, 0)), sk.clamp(max=max(n - 1, 0))
    mask = (sq[:, None] == sk[None, :]) & (sq[:, None] < n)
    if causal:  # key offset <= query offset + (len_k - len_q) of the sequence
        shift = (cu_k[1:] - cu_k[:-1]) - (cu_q[1:] - cu_q[:-1])
        mask &= _causal_band((kj - cu_k[skc])[None, :], (qi - cu_q[sqc] + shift[sqc])[:, None], window)
    return mask[None, None]


def _padding_dense(mask: torch.Tensor, q_len: int, causal: bool, window) -> torch.Tensor:
    """(B, 1, q_len, n) boolean: a (B, n) padding mask over the keys (queries its last q_len columns)
    with bottom-right causality and the window: HF's mask of the same call."""
    n = mask.shape[1]
    dense = mask[:, None, None, :].expand(-1, 1, q_len, -1)
    if causal:
        kpos = torch.arange(n, device=mask.device)[None, :]
        last = (n - q_len + torch.arange(q_len, device=mask.device))[:, None]
        dense = dense & _causal_band(kpos, last, window)
    return dense
