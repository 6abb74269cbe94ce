"""Coqui's released XTTS-v2 folder: read as a user downloads it, with no pickle executed,
and written back out in the released layout (``myxtts export --format xtts``).

    folder        read_xtts_v2 / write_xtts_v2: the whole folder, XttsV2Files
    config_file   config.json <-> XttsV2Config (other keys kept), text tokens of vocab.json
    model_file    model.pth's forms (release, trainer checkpoint, inference aliases, either
                  weight-norm naming) <-> our state dict; the checks against the config
    torch_files   torch files read with weights_only (coqui's pickled config as stand-ins),
                  their tensors checked by name, shape, kind and finiteness
    layout        the released state dicts' names and shapes, computed from the config
    weight_norm   weight norm folded into one weight and unfolded again
    bundle        the model as one myxtts bundle (safetensors, checksummed); is_xtts_v2
    run           a fine-tuning run read back as the whole model; what its checkpoints record
"""

from myxtts.artifacts.xtts_v2.bundle import (
    is_xtts_v2,
    read_xtts_v2_any,
    read_xtts_v2_bundle,
    write_xtts_v2_bundle,
)
from myxtts.artifacts.xtts_v2.folder import XttsV2Files, read_xtts_v2, write_xtts_v2

__all__ = ["XttsV2Files", "is_xtts_v2", "read_xtts_v2", "read_xtts_v2_any", "read_xtts_v2_bundle",
           "write_xtts_v2", "write_xtts_v2_bundle"]
