"""A whole diffusers pipeline under one manager: one plan per component, one Run for all.

The pipeline's torch components are gathered under one container module whose submodules are
named by component, so the groups of the merged plan (``transformer.blocks``,
``text_encoder.encoder.block``) are found by name and one run holds every component. A
component without a layer group is one *unit* (a one-layer group named after it): it is copied
in when any of its top-level submodules starts running (``vae.decode`` never calls
``vae.forward``) and released when that submodule returns. Each component's top-level
forwards are its calls (a forward of the component or, outermost, of one of its children);
the pipeline's scheduler closes the steps, so an encoder's calls land in the first step and
the VAE's decode, after the last ``scheduler.step``, in a last step of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn

from offload_lab.model.pipeline import torch_components
from offload_lab.record.runtime.manager import ACTIVE, OffloadError, OffloadManager
from offload_lab.record.runtime.options import OffloadOptions, resolve_options

if TYPE_CHECKING:
    from offload_lab.planning.pipeline import PipelinePlan


class PipelineModules(nn.Module):
    """The components of a pipeline under one module; a unit component sits in a one-item list.

    Only a container: it is never called, and it owns nothing of its own.
    """

    def __init__(self, components: dict[str, nn.Module], units: set[str]):
        super().__init__()
        for name, mod in components.items():
            self.add_module(name, nn.ModuleList([mod]) if name in units else mod)


def _entries(mod: nn.Module) -> list[nn.Module]:
    """The submodules through which a unit's weights are used: its direct children."""
    kids = [m for m in mod.children() if any(True for _ in m.parameters())]
    return kids or [mod]


class PipelineManager(OffloadManager):
    """:class:`OffloadManager` over a pipeline's components (see the module documentation)."""

    _context = "offload(pipe, pipeline_plan)"

    def __init__(self, pipe: Any, pplan: PipelinePlan, options: OffloadOptions | None = None, **kwargs: Any):
        mods = torch_components(pipe)
        missing = [n for n in pplan.components if n not in mods]
        if missing:
            raise OffloadError(f"pipeline plan component(s) {missing} are not torch components of "
                               f"{type(pipe).__name__}: {list(mods)}")
        plan = pplan.merged()
        units = {n for n, p in pplan.components.items() if p.spec.group_names == [n]}
        comps = {n: mods[n] for n in pplan.components}
        self.pipe = pipe
        self._units = {n: _entries(comps[n]) for n in units}
        self._components = comps
        opts = resolve_options(options, **kwargs)
        if isinstance(opts.scheduler, str) and opts.scheduler == "auto":
            opts = opts.replace(scheduler=pipe)
        super().__init__(PipelineModules(comps, units), plan, options=opts)

    def _start(self) -> None:
        super()._start()
        self._meta["pipeline"] = type(self.pipe).__name__
        self._meta["components"] = {n: [g for g in self.plan.spec.group_names
                                         if g == n or g.startswith(n + ".")] for n in self._components}
        self._meta["model"] = type(self.pipe).__name__

    def _claim(self) -> None:
        busy = [n for n, m in self._components.items() if m in ACTIVE]
        if busy:
            raise OffloadError(f"component(s) {busy} are already under an offload manager; leave that one first")
        super()._claim()
        for m in self._components.values():
            ACTIVE.add(m)

    def _restore_actions(self) -> list[Callable[[], None]]:
        def release_components() -> None:
            for m in self._components.values():
                ACTIVE.discard(m)

        return [*super()._restore_actions(), release_components]

    def _call_starting(self, root: str) -> None:
        # a request ends with the VAE's decode, after the last scheduler step: the next call of
        # another component starts the next request, so the decode keeps a step of its own
        last = self._calls[-1] if self._calls else None
        if last is not None and last.root == "vae" and root != "vae" and \
                last.epoch == len(self._ticks) and last.end is not None:
            self._ticks.append(last.end)

    def _call_roots(self) -> dict[str, list[Any]]:
        # the component and its children: a call starts at the outermost of them, so a VAE whose
        # pipeline calls ``vae.decode`` (never ``vae.forward``) still has calls
        return {n: [m, *_entries(m)] if n not in self._units else self._units[n]
                for n, m in self._components.items()}

    def _install_hooks(self) -> None:
        for g in self._groups:
            entries = self._units.get(g.name)
            if entries is None:
                for i, block in enumerate(g.blocks):
                    hooks = self._make_hooks(g, i)
                    self._hooks.append(block.register_forward_pre_hook(hooks.pre_forward))
                    self._hooks.append(block.register_forward_hook(hooks.post_forward))
                continue
            hooks = self._make_hooks(g, 0)
            pre, post = _outermost(hooks.pre_forward, hooks.post_forward)
            for m in entries:
                self._hooks.append(m.register_forward_pre_hook(pre))
                self._hooks.append(m.register_forward_hook(post, always_call=True))


def _outermost(pre: Callable, post: Callable) -> tuple[Callable, Callable]:
    """Hooks that run ``pre``/``post`` only around the outermost of nested entries."""
    depth = [0]

    def p(module, args):
        depth[0] += 1
        if depth[0] == 1:
            pre(module, args)

    def q(module, args, *rest):
        depth[0] = max(depth[0] - 1, 0)
        if depth[0] == 0:
            post(module, args, *rest)

    return p, q
