"""The one brief factory of the tests, the benchmarks and the fault harness."""

from __future__ import annotations

from typing import Any

from castad_contracts import brief

# What a numbered series of briefs takes in turn, so that traffic asks for every language, shape and kind of song.
LANGUAGES = tuple(brief.Language)
GENRES = ("pop, ambient", "acoustic folk", "lo-fi hip hop", "jazz", "trot", "indie rock", "ballad")
ORIENTATIONS = tuple(brief.Orientation)


def sample(
    customer: str | None = None, *, number: int | None = None, duration_s: int | None = None, **fields: Any
) -> brief.Brief:
    """Return a brief of a small bookshop by the sea in Sokcho, sung in Korean for 3 seconds on a vertical video.

    With `number`, the brief is instead the `number`th of a series, as the fault harness's traffic sends them: each
    language, genre and orientation in turn, named in Korean and English and set in Gunsan and Busan by turns,
    3 to 6 seconds long. `customer` (the business's name), `duration_s` and any other field of the brief
    (`language=brief.Language.ENGLISH`, `photos=(...)`) are taken as given either way.
    """
    if number is None:
        values: dict[str, Any] = {
            "customer_name": "바다책방",
            "region": "속초",
            "detail_region_info": "동명항 옆 작은 서점, 바다가 보이는 창가 자리",
            "genre": brief.Style.ACOUSTIC.value,
            "orientation": brief.Orientation.VERTICAL,
            "duration_s": 3,
        }
    else:
        values = {
            "customer_name": f"가게 {number}" if number % 2 else f"Shop {number}",
            "region": "군산" if number % 3 else "Busan",
            "detail_region_info": "바다가 보이는 한옥, 골목 산책",
            "language": LANGUAGES[number % len(LANGUAGES)],
            "genre": GENRES[number % len(GENRES)],
            "orientation": ORIENTATIONS[number % len(ORIENTATIONS)],
            "duration_s": 3 + number % 4,
        }
    if customer is not None:
        values["customer_name"] = customer
    if duration_s is not None:
        values["duration_s"] = duration_s
    return brief.Brief(**(values | fields))
