"""A decode lane for tests of the rules over lanes: slot 0 at epoch 1 feeding token 7 at
position 5 after a four-token prompt, sampling greedily with eight tokens left."""

from __future__ import annotations

from domain.engine.step import SlotWork
from domain.requests.choice_sampling import LaneSampling
from domain.requests.sampling import SamplingParams

SAMPLING = LaneSampling(SamplingParams(), 0, remaining=8)


def lane(**parts) -> SlotWork:
    """That lane with `parts` (any `SlotWork` field) in place of its own."""
    fields = dict(
        slot=0,
        epoch=1,
        token_ids=(7,),
        start_position=5,
        block_table=(0, 1),
        prompt_len=4,
        sample=True,
        sampling=SAMPLING,
    )
    return SlotWork(**{**fields, **parts})
