"""A decoder forward in one loop, for quickdraft's int8 models (gpt-fast's shape).

transformers runs each decoder layer through a stack of Python frames: the layer's and its
attention's `__call__`, a decorator per forward for renamed arguments, the mask factory and
output capture per model forward, keyword arguments merged at every level. A one-token step
of the 1.5B on 2 cores is bound by its weights (1.5 GB) and by fixed costs per layer. `install`
gives the decoder (the `model.model` of a Qwen2 or Llama causal LM) a forward that walks the
layers in one loop and calls what each layer computes with directly: the projections (a fused
group once: `fused_linears`), the cache's `update`, the attention function `quantize_model`
registered. Together with a leaner `Int8Linear` call, one process, interleaved, 2 AMX cores:
the target's step 5 % faster, the draft's 10 %.

Between the matmuls, two ways, one per model and process:
- the C glue (`layer_glue`; where it loads and the model is laid out for it): the residual
  add with the RMSNorm after it, the rotary embedding, SiLU(gate) * up, each a call. Its
  results differ from torch's in the last bits, so it computes every forward of the model:
  verify and tree forwards stay bitwise their steps, a warm prefill the cold one
  (`tests/unit/test_models_decoder_loop.py`);
- else the layers' own torch operations (their norms' `forward`, the model's rotary function,
  the MLP's activation), in the same order on the same tensors: every output is bitwise the
  model's own forward's (tested for prefill chunks, steps, verify and tree forwards, and
  steps that fold prompt rows).

Where the loop does not apply, the model's own forward runs: under torch.compile, without a
cache in the torch way (the model's own forward makes one; the glue makes one itself), with an
attention mask, input embeddings or any argument it does not know, and while a hook sits on a
module below the decoder's layers (a profiler's: `step_profile` hooks the modules it times).
The layers' own forward hooks and pre-hooks the loop calls as `__call__` would (the runner's
cancel check, `Runner.stopping_at`, is a pre-hook).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as torch_module
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast

from quickdraft.decoding.runner import PREFILL_KWARG, TREE_KWARG
from quickdraft.models import layer_glue

LAYER_TYPES = ("Qwen2DecoderLayer", "LlamaDecoderLayer")
"""Decoder layers whose forward this loop repeats (the same pre-norm block, SwiGLU MLP)."""
STEP_KWARGS = (PREFILL_KWARG, TREE_KWARG, "cache_position")
"""What the runners pass through the model to the attention function (and the cache)."""
KNOWN_KWARGS = frozenset(
    ("input_ids", "attention_mask", "position_ids", "cache", "past_key_values")
    + ("inputs_embeds", "use_cache", *STEP_KWARGS)
)
_CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else None


def install(
    model: nn.Module, attention: Callable[..., tuple[torch.Tensor, Any]], *, glue: bool = True
) -> bool:
    """Give `model.model` the loop's forward, its attention computed by `attention` (the function
    its config's attention implementation names), the work between its matmuls by `layer_glue`
    where `glue`, the kernel loads and the model is laid out for it (float32, fused
    projections, SiLU), else by the layers' own torch operations. False, and nothing changed,
    for a model not laid out as LAYER_TYPES are."""
    decoder = getattr(model, "model", None)
    if not _fits(decoder):
        return False
    settle_rotary_math()
    decoder._quickdraft_attention = attention
    decoder._quickdraft_glue = layer_glue.load()[0] if glue and _glue_fits(decoder) else None
    decoder.forward = types.MethodType(_forward, decoder)
    decoder.before_compile = types.MethodType(_before_compile, decoder)
    return True


def settle_rotary_math() -> None:
    """Compute one cosine and one sine on this thread, before any forward of the process.

    Seen on 2 AMX cores with torch 2.13: the process's first `cos` that ran on both threads
    (the rotary table of a 128-row prefill chunk, after other OpenMP work) came out off by up to
    1.5e-4 in one thread's half (cos(0.1) = 0.994866) in 5 of 20 processes; every later call
    was exact. So the first prefill's keys differed from any later prefill's, a warm cache from
    a cold one (`tests/unit/test_tree.py` failed by chance). With one small call on one thread
    first: 0 of 48. torch's float `cos` is MKL's `vmsCos`: apparently its one-time setup,
    entered by two threads at once, leaves one of them on a less accurate path.
    """
    one = torch.ones(1)
    one.cos(), one.sin()


def _before_compile(decoder: nn.Module) -> None:
    """Called by a runner before it compiles the model's steps (as on every module that has
    it): compiled steps run the model's own forward, torch's operations between the matmuls,
    so the loop's eager forwards (prefill chunks, oversized steps) drop the glue and round as
    they do."""
    decoder._quickdraft_glue = None


def glued(model: nn.Module) -> bool:
    """Whether the loop of this model's decoder runs the work between matmuls in C."""
    return getattr(getattr(model, "model", None), "_quickdraft_glue", None) is not None


def installed(model: nn.Module) -> bool:
    """Whether `install` gave this model's decoder the loop."""
    decoder = getattr(model, "model", None)
    return isinstance(getattr(decoder, "__dict__", {}).get("forward"), types.MethodType)


def _fits(decoder: Any) -> bool:
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        return False
    if not all(hasattr(decoder, name) for name in ("embed_tokens", "norm", "rotary_emb")):
        return False
    for layer in layers:
        if type(layer).__name__ not in LAYER_TYPES:
            return False
        attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not all(hasattr(attention, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return False
        if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return False
        if not hasattr(sys.modules.get(type(attention).__module__), "apply_rotary_pos_emb"):
            return False
    return True


def _glue_fits(decoder: nn.Module) -> bool:
    config = decoder.config
    if getattr(config, "hidden_act", None) != "silu":
        return False
    norms = [decoder.norm]
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not (_fused(attn, QKV, "fused_q_k_v") and _fused(mlp, GATE_UP, "fused_gate_up")):
            return False
        if not layer_glue.fits(config.hidden_size, attn.head_dim, config.intermediate_size):
            return False
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
    return all(
        hasattr(norm, "variance_epsilon")
        and norm.weight.dtype == torch.float32
        and norm.weight.is_contiguous()
        for norm in norms
    )


def _forward(decoder: nn.Module, *args: Any, **kwargs: Any) -> BaseModelOutputWithPast:
    """The decoder's forward: the loop, or the model's own where the loop does not apply."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    glue = decoder._quickdraft_glue
    if (
        args
        or not KNOWN_KWARGS.issuperset(kwargs)
        or kwargs.get("input_ids") is None
        or kwargs["input_ids"].dim() != 2
        or kwargs.get("attention_mask") is not None
        or kwargs.get("inputs_embeds") is not None
        or (cache is None and glue is None)
        or (glue is not None and kwargs["input_ids"].shape[0] != 1)  # the glue: one sequence
        or torch.compiler.is_compiling()
        or _hooked(decoder)
    ):
        return type(decoder).forward(decoder, *args, **kwargs)
    if cache is None:  # as the model's own forward does, where its keys are then read from
        cache = DynamicCache(config=decoder.config)
    step = {name: kwargs[name] for name in STEP_KWARGS if name in kwargs}
    hidden = decoder.embed_tokens(kwargs["input_ids"])
    positions = kwargs.get("position_ids")
    if positions is None:
        past = cache.get_seq_length()
        positions = torch.arange(past, past + hidden.shape[1], device=hidden.device).unsqueeze(0)
    cos, sin = decoder.rotary_emb(hidden, positions)
    attention = decoder._quickdraft_attention
    if glue is not None:
        cos, sin = cos[0].contiguous(), sin[0].contiguous()
    pending = None  # with the glue: the last MLP's output, added to `hidden` by the next norm
    for layer in decoder.layers[: decoder.config.num_hidden_layers]:
        layer_input = hidden  # (the same tensor, updated in place, with the glue)
        for hook in layer._forward_pre_hooks.values():
            changed = hook(layer, (hidden,))
            if changed is not None:
                if glue is not None:
                    raise RuntimeError("a forward pre-hook replaced a layer's input under the glue")
                hidden = changed[0] if isinstance(changed, tuple) else changed
        if glue is None:
            hidden = _layer(layer, hidden, cos, sin, cache, attention, step)
        else:
            pending = _glued_layer(layer, hidden, pending, cos, sin, cache, attention, step, glue)
        if layer._forward_hooks:  # the layer's output whole: the same add the next norm makes
            if pending is not None:
                hidden, pending = hidden.add_(pending), None
            for hook in layer._forward_hooks.values():
                hook(layer, (layer_input,), hidden)
    if glue is None:
        hidden = decoder.norm.forward(hidden)
    else:
        norm = decoder.norm
        hidden = glue.add_rms_norm(hidden, pending, norm.weight, norm.variance_epsilon)
    held = {_CACHE_FIELD: cache} if _CACHE_FIELD and kwargs.get("use_cache", True) else {}
    return BaseModelOutputWithPast(last_hidden_state=hidden, **held)


def _layer(layer, hidden, cos, sin, cache, attention, step) -> torch.Tensor:
    """One decoder layer, as its own forward computes it."""
    attn, mlp = layer.self_attn, layer.mlp
    residual = hidden
    hidden = layer.input_layernorm.forward(hidden)
    shape = (*hidden.shape[:-1], -1, attn.head_dim)
    query, key, value = _projections(attn, hidden, QKV, "fused_q_k_v")
    query = query.view(shape).transpose(1, 2)
    key = key.view(shape).transpose(1, 2)
    value = value.view(shape).transpose(1, 2)
    rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb
    query, key = rotate(query, key, cos, sin)
    out = _attend(attention, attn, query, key, value, cache, step)
    out = out.reshape(*hidden.shape[:-1], -1).contiguous()
    hidden = residual + attn.o_proj(out)
    residual = hidden
    hidden = layer.post_attention_layernorm.forward(hidden)
    gate, up = _projections(mlp, hidden, GATE_UP, "fused_gate_up")
    return residual + mlp.down_proj(mlp.act_fn(gate) * up)


def _glued_layer(layer, hidden, pending, cos, sin, cache, attention, step, glue) -> torch.Tensor:
    """One decoder layer with the work between its matmuls in `layer_glue`: `hidden` (the
    residual stream, contiguous) gets the previous layer's MLP output `pending` and this
    layer's attention output added in place; returns this layer's MLP output."""
    attn, mlp = layer.self_attn, layer.mlp
    norm = layer.input_layernorm
    normed = glue.add_rms_norm(hidden, pending, norm.weight, norm.variance_epsilon)
    fused = attn.fused_q_k_v
    states = fused.fused(normed)  # [1, rows, q | k | v]
    heads, kv_heads = fused.sizes[0] // attn.head_dim, fused.sizes[1] // attn.head_dim
    glue.rotary(states, heads, cos, sin)
    glue.rotary(states[..., fused.sizes[0] :], kv_heads, cos, sin)
    query, key, value = states.split(fused.sizes, dim=-1)
    shape = (*normed.shape[:-1], -1, attn.head_dim)
    query = query.view(shape).transpose(1, 2)
    key, value = key.view(shape).transpose(1, 2), value.view(shape).transpose(1, 2)
    out = _attend(attention, attn, query, key, value, cache, step)
    out = attn.o_proj(out.reshape(*normed.shape[:-1], -1).contiguous())
    norm = layer.post_attention_layernorm
    normed = glue.add_rms_norm(hidden, out, norm.weight, norm.variance_epsilon)
    return mlp.down_proj(glue.silu_mul(mlp.fused_gate_up.fused(normed)))


def _attend(attention, attn, query, key, value, cache, step) -> torch.Tensor:
    """The new keys and values into the cache, and the attention of the queries over it, as
    the attention module does: [1, heads, rows, dim] in, [1, rows, heads, dim] out. The cache
    gets the forward's cache positions where the runner gave them (a static cache's:
    transformers 4 reads them there, 5 keeps its own count)."""
    if "cache_position" in step:
        positions = {"cache_position": step["cache_position"]}
        key, value = cache.update(key, value, attn.layer_idx, positions)
    else:
        key, value = cache.update(key, value, attn.layer_idx)
    out, _ = attention(
        attn,
        query,
        key,
        value,
        None,
        dropout=0.0,
        scaling=attn.scaling,
        sliding_window=getattr(attn, "sliding_window", None),
        **step,
    )
    return out


QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


def _fused(module, names, fused_name) -> bool:
    """Whether `fuse_projections` fused `names` of `module` into `fused_name`, in that order."""
    fused = getattr(module, fused_name, None)
    parts = [getattr(module, name, None) for name in names]
    return fused is not None and all(
        getattr(part, "group", None) is fused and getattr(part, "index", None) == i
        for i, part in enumerate(parts)
    )


def _projections(module, hidden, names, fused_name) -> tuple[torch.Tensor, ...]:
    """The projections `names` of `hidden`: one call where `fuse_projections` fused them (what
    their parts would each take from it), else one each."""
    if _fused(module, names, fused_name):
        fused = getattr(module, fused_name)
        return fused.fused(hidden).split(fused.sizes, dim=-1)
    return tuple(getattr(module, name)(hidden) for name in names)


def _hooked(decoder: nn.Module) -> bool:
    """Whether a hook would see the loop skip a module's `__call__`: a global hook, one on any
    module below the decoder's layers or on its final norm. The layers' own hooks the loop
    calls (with the glue, a pre-hook sees the residual stream before the last MLP's output is
    added, which the next norm does; a forward hook sees the layer's output whole)."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    if decoder.norm._forward_hooks or decoder.norm._forward_pre_hooks:
        return True
    for layer in decoder.layers:
        if layer._forward_pre_hooks_with_kwargs or layer._forward_hooks_with_kwargs:
            return True
        for module in layer.modules():
            if module is not layer and (module._forward_hooks or module._forward_pre_hooks):
                return True
    return False
