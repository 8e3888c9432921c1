"""The one brief factory of the tests."""

from __future__ import annotations

from typing import Any

from castad_contracts import brief


def sample(customer: str = "바다책방", *, duration_s: int = 3, **fields: Any) -> brief.Brief:
    """A small bookshop by the sea in Sokcho, sung in Korean for `duration_s` seconds on a vertical video.

    Any other field of the brief may be given (`language=brief.Language.ENGLISH`, `photos=(...)`).
    """
    values: dict[str, Any] = {
        "customer_name": customer,
        "region": "속초",
        "detail_region_info": "동명항 옆 작은 서점, 바다가 보이는 창가 자리",
        "genre": brief.Style.ACOUSTIC.value,
        "orientation": brief.Orientation.VERTICAL,
        "duration_s": duration_s,
    }
    return brief.Brief(**(values | fields))
