"""Weight norm between the released file's two tensors and the one weight our modules hold.

XTTS-v2's HiFi-GAN convolutions are weight-normed: the released ``model.pth`` stores each as
a magnitude ``g`` (one value per slice along dim 0, ``[out, 1, 1]``) and a direction ``v``,
named ``parametrizations.weight.original0`` / ``original1`` (torch's parametrization, as
coqui-tts 0.28 saves them) or ``weight_g`` / ``weight_v`` (older files, torch's former
``weight_norm`` hook). The effective weight is ``g * v / ||v||``, the norm over every dim
but 0. Our modules hold that weight alone (speaking needs nothing else), so reading folds the
pair into ``weight`` and writing unfolds it again. Folding runs torch's own kernel
(``torch._weight_norm``, what its parametrization runs), so a folded weight is bit-equal to
coqui's ``module.weight``. Unfolding takes ``g`` as the norms that same kernel computes, so
that fold(unfold(w)) is w exactly (torch's ``right_inverse`` takes ``norm_except_dim``,
which sums in another order: off by an ulp, and a read-write-read would not return the
weights it started from).
"""

from __future__ import annotations

import torch

from myxtts.artifacts.errors import ArtifactError

# (magnitude, direction) suffixes of a weight-normed weight, newest naming first
PARAMETRIZED = (".parametrizations.weight.original0", ".parametrizations.weight.original1")
HOOKED = (".weight_g", ".weight_v")


def fold(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The weight ``g * v / ||v||`` (norm over every dim of ``v`` but 0), as torch computes it."""
    return torch._weight_norm(v, g, 0)


def unfold(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, v)`` whose :func:`fold` is ``weight``: ``v`` the weight itself, ``g`` its norm
    over every dim but 0 as :func:`fold`'s kernel computes it (so their ratio is exactly 1)."""
    ones = torch.ones(weight.shape[:1] + (1,) * (weight.ndim - 1), dtype=weight.dtype,
                      device=weight.device)
    norms = torch._weight_norm_interface(weight, ones, 0)[1]
    return norms.reshape(ones.shape).to(weight.dtype), weight


def fold_state(state: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """``state`` with every weight-normed pair (either naming) folded into ``PREFIX.weight``,
    in the place of the pair's first tensor; other entries as they are. An unpaired half, a
    pair beside a plain ``weight`` of the same layer, or a magnitude that is not one value
    per slice along dim 0 is an ArtifactError naming ``where`` and the key."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for g_suffix, v_suffix in (PARAMETRIZED, HOOKED):
            if key.endswith(g_suffix) or key.endswith(v_suffix):
                suffix = g_suffix if key.endswith(g_suffix) else v_suffix
                prefix = key[:-len(suffix)]
                g_key, v_key = prefix + g_suffix, prefix + v_suffix
                if g_key not in state or v_key not in state:
                    other = v_key if key == g_key else g_key
                    raise ArtifactError(f"{where}: {key} comes without {other} (the two halves of "
                                        f"a weight-normed weight); the file is damaged or edited")
                name = prefix + ".weight"
                if name in state:
                    raise ArtifactError(f"{where}: {name} appears beside {key} (a weight stored "
                                        f"twice); the file is damaged or edited")
                if name not in out:
                    out[name] = _folded(state[g_key], state[v_key], g_key, where)
                break
        else:
            out[key] = value
    return out


def _folded(g: torch.Tensor, v: torch.Tensor, g_key: str, where: str) -> torch.Tensor:
    per_slice = (v.shape[:1] + (1,) * (v.ndim - 1)) if v.ndim else None
    if not (isinstance(g, torch.Tensor) and isinstance(v, torch.Tensor)) or per_slice is None \
            or tuple(g.shape) != tuple(per_slice):
        found = list(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
        raise ArtifactError(f"{where}: {g_key} has shape {found}, a weight norm over dim 0 of a "
                            f"weight of shape {list(getattr(v, 'shape', []))} needs "
                            f"{list(per_slice or [])}")
    return fold(g, v)


def unfold_state(state: dict[str, torch.Tensor], normed: set[str]) -> dict[str, torch.Tensor]:
    """``state`` with each weight named in ``normed`` unfolded into the released naming
    (``parametrizations.weight.original0/1``), in its place; other entries as they are."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in normed:
            prefix = key[:-len(".weight")]
            g, v = unfold(value)
            out[prefix + PARAMETRIZED[0]], out[prefix + PARAMETRIZED[1]] = g, v
        else:
            out[key] = value
    return out
