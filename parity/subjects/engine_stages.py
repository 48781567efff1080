"""Records a DeepSpeed engine's optimizer-side stage inputs for parity/checks/optimizer_stages.py.

Each micro-batch's own gradient, as autograd hands it in before it is accumulated (a tensor hook runs
before p.grad or the engine's accumulation hook sees it), and the gradient and weight (the float32
master where one is kept) that the wrapped torch optimizer's step() starts from, after the engine's
unscaling and clipping. Per-instance wrappers on the rank's own engine: DeepSpeed itself is not patched.
"""
from __future__ import annotations


def install(update, engine, params: dict, zero: int):
    """Hooks recording into update.obs at update.step / update.micro; ZeRO-3 (partitioned parameters,
    its own hooks) records nothing. Returns an undo."""
    if zero == 3:
        return lambda: None
    obs = update.obs
    def micro_grad(name, g):
        obs.record_stage("micro_grad", update.step, update.micro, name, g, unscale=update.scale)
        obs.facts.setdefault("stage_scales", {})[update.step] = update.scale  # what the records were divided by

    hooks = [p.register_hook(lambda g, name=name: micro_grad(name, g)) for name, p in params.items() if p.requires_grad]
    # ZeRO 1-2's own optimizer (BF16_Optimizer, which ZeRO 1 with grad_accum_dtype fp32 builds, reduces through
    # the engine's _reduce_non_expert_gradients below)
    zero_optimizer = zero in (1, 2) and hasattr(engine.optimizer, "reduce_independent_p_g_buckets_and_remove_grads")
    undo_zero = _install_zero_reduce(update, engine.optimizer, params) if zero_optimizer else (lambda: None)
    wrapper = engine.optimizer
    inner = getattr(wrapper, "optimizer", wrapper)  # fp32 at ZeRO 0: the torch optimizer itself
    original = inner.step

    def step(*args, **kwargs):
        for name, (grad, start) in _step_inputs(wrapper, inner, params, zero).items():
            if grad is not None and start is not None:
                obs.record_stage("opt_grad", update.step, None, name, grad)
                obs.record_stage("opt_start", update.step, None, name, start)
        return original(*args, **kwargs)

    inner.step = step
    reduce = engine._reduce_non_expert_gradients  # ZeRO 0 and BF16_Optimizer: the boundary's DP reduction

    def reduce_gradients(*args, **kwargs):
        held = _reduced(wrapper, params)
        for name, g in held.items():
            obs.record_stage("reduce_in", update.step, None, name, g, unscale=update.scale)
        result = reduce(*args, **kwargs)
        for name, g in held.items():
            obs.record_stage("reduce_out", update.step, None, name, g, unscale=update.scale)
        obs.facts["comm_dtype"] = str(engine.communication_data_type).replace("torch.", "")
        return result

    engine._reduce_non_expert_gradients = reduce_gradients

    def undo():
        undo_zero()
        for h in hooks:
            h.remove()
        inner.step = original
        engine._reduce_non_expert_gradients = reduce
    return undo


def _install_zero_reduce(update, opt, params: dict):
    """ZeRO 1-2: each parameter's reduction dtype (get_param_comm_dtype: torch_autocast's marks, else
    communication_data_type) into facts["reduce_dtypes"]. ZeRO 1 reduces the accumulated gradient at the boundary: it
    is recorded as reduce_in. ZeRO 2 reduces every micro-batch's gradient before accumulating it (partition_gradients):
    facts["micro_reduce_dtypes"] tells the oracle so. Returns an undo."""
    obs, names = update.obs, {id(p): name for name, p in params.items()}
    dtypes = {name: str(opt.get_param_comm_dtype(p)).replace("torch.", "") for name, p in params.items()
              if p.requires_grad}
    obs.facts["reduce_dtypes"] = dtypes
    if opt.partition_gradients:
        obs.facts["micro_reduce_dtypes"] = dtypes
        return lambda: None
    original = opt.reduce_independent_p_g_buckets_and_remove_grads

    def reduce_one(param, i):
        grad, name = opt.get_gradient_for_reduction(param), names.get(id(param))
        if grad is not None and name is not None:
            obs.record_stage("reduce_in", update.step, None, name, grad, unscale=update.scale)
        return original(param, i)

    opt.reduce_independent_p_g_buckets_and_remove_grads = reduce_one

    def undo():
        del opt.reduce_independent_p_g_buckets_and_remove_grads  # the class's method again
    return undo


def _reduced(wrapper, params: dict) -> dict:
    """name -> the gradient tensor the reduction reduces in place: BF16_Optimizer's float32 accumulation buffer,
    else p.grad."""
    if hasattr(wrapper, "fp32_groups_gradients") and hasattr(wrapper, "bf16_groups"):
        hp = {id(p): g for lows, highs in zip(wrapper.bf16_groups, wrapper.fp32_groups_gradients)
              for p, g in zip(lows, highs)}
        return {name: hp[id(p)] for name, p in params.items() if id(p) in hp}
    return {name: p.grad for name, p in params.items() if p.grad is not None}


def _step_inputs(wrapper, inner, params: dict, zero: int) -> dict:
    """name -> (gradient, weight) as the inner step is about to read them, in the rank's TP-local shape."""
    if wrapper is inner:
        return {name: (p.grad, p.data) for name, p in params.items()}
    if zero == 0 and hasattr(wrapper, "fp32_groups") and hasattr(wrapper, "fp16_groups"):
        master = {id(p): m for lows, highs in zip(wrapper.fp16_groups, wrapper.fp32_groups)
                  for p, m in zip(lows, highs)}
        return {name: (master[id(p)].grad, master[id(p)].data) for name, p in params.items() if id(p) in master}
    return {name: _full_hp(p, inner) for name, p in params.items() if hasattr(p, "_hp_mapping")}


def _full_hp(p, inner):
    """ZeRO 1-2 and BF16_Optimizer: the parameter's float32 gradient and master, assembled from each data-parallel
    rank's fragment of the flat partition the inner optimizer steps (deepspeed.utils.tensor_fragment's
    get_full_hp_param, which serves the master alone; its gradient getter refuses once the step has begun)."""
    import torch
    from deepspeed import comm as dist

    mapping = p._hp_mapping
    dtype = inner.param_groups[0]["params"][0].dtype  # the partition's: float32, or bf16 masters
    full = torch.zeros(2, p.numel(), dtype=dtype, device=p.device)
    if mapping is None:  # no fragment on this data-parallel rank: it adds zeros, as get_full_hp_param does
        dist.all_reduce(full, group=p._dp_group)
        return full[0].reshape(p.shape), full[1].reshape(p.shape)
    flat = inner.param_groups[mapping.param_group_index]["params"][0]
    hp, lp = mapping.hp_fragment_address, mapping.lp_fragment_address
    full[0].narrow(0, lp.start, lp.numel).copy_(flat.grad.narrow(0, hp.start, hp.numel))
    full[1].narrow(0, lp.start, lp.numel).copy_(flat.data.narrow(0, hp.start, hp.numel))
    dist.all_reduce(full, group=p._dp_group)
    return full[0].reshape(p.shape), full[1].reshape(p.shape)
