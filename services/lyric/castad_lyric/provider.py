"""Lyric providers: write the words of a marketing song from a brief."""

from __future__ import annotations

import dataclasses
import random
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from castad_contracts import brief, events
from castad_runtime.stage import cancellation

SectionKind = Literal["verse", "chorus", "bridge"]

SECONDS_PER_LINE = 2.5
MIN_LINES_PER_SECTION = 2
MAX_LINES_PER_SECTION = 6
MAX_PHRASES = 8
MAX_KEYWORDS = 10


class LyricProvider(Protocol):
    def write(
        self,
        brief: brief.Brief,
        seed: str,
        cancel: cancellation.Cancellation,
        attempt: int = 1,
        note: str | None = None,
    ) -> events.Lyrics:
        """The lyrics of `brief`, the same for the same `seed` (a pipeline); `attempt`: the job's counted attempt.

        `note`: what a person reviewing the last draft asked to change (a writer that cannot follow it writes anew
        from its new seed)."""
        ...


@dataclasses.dataclass(frozen=True)
class Mood:
    """Words that colour a genre: adjectives, nouns, times of day and sung calls."""

    adjectives: tuple[str, ...]
    nouns: tuple[str, ...]
    times: tuple[str, ...]
    calls: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Phrasebook:
    """Line templates of one language. Fields in braces are slots; `{x:이}` adds a Korean particle."""

    max_chars: int
    titles: tuple[str, ...]
    openers: tuple[str, ...]
    details: tuple[str, ...]
    verses: tuple[str, ...]
    hooks: tuple[str, ...]
    choruses: tuple[str, ...]
    bridges: tuple[str, ...]
    moods: Mapping[brief.Style, Mood]


KOREAN = Phrasebook(
    max_chars=22,
    titles=("{region}의 {name}", "{name}의 노래", "{adj} {name}", "{region}, {name}", "안녕, {name}"),
    openers=(
        "{region}에 {noun:이} 내리면",
        "{adj} {region}의 {time}",
        "{region} 바람 따라 걸어",
        "발길이 닿은 곳 {region}",
        "{time}, {region}에서",
        "{region} 골목 끝에서",
        "{adj} {region:으로} 가요",
        "{region}의 {noun:을} 따라",
    ),
    details=(
        "{phrase}",
        "{phrase}, 거기서 만나",
        "{phrase} 그곳으로",
        "{kw:이} 기다리는 곳",
        "{kw:과} 함께하는 {time}",
        "{kw} 이야기 가득한 곳",
        "{kw}, 그리고 {noun}",
        "{adj} {kw:을} 만나러",
    ),
    verses=(
        "{adj} {noun:을} 따라서",
        "{adj} 하루 끝에 찾은 곳",
        "창밖엔 {noun}, 곁엔 너",
        "마음이 먼저 닿는 곳",
        "{noun:이} 머무는 자리",
        "{name:이} 문을 열면",
        "{name}에서 쉬어 가요",
        "우리 함께 걸어요",
        "{noun} 아래 웃음꽃",
        "다시 오고 싶은 곳",
        "{adj} 기억 하나 둘",
        "잠시 쉬어 가도 좋아",
    ),
    hooks=(
        "{call}, {name}",
        "{region}엔 {name:이} 있어",
        "오늘도 {name}에서 만나",
        "{adj} 그곳 {name}",
        "{name:으로} 놀러 와요",
        "{region}의 자랑 {name}",
        "언제라도 {name}",
        "여기가 바로 {name:이야}",
    ),
    choruses=(
        "{name:과} 함께라면",
        "{region}에서 만나요",
        "{call} {call}",
        "{adj} 오늘을 노래해",
        "{kw:과} 너, 그리고 나",
        "돌아와 {region:으로}",
        "우리의 {adj} 시간",
        "{noun:을} 담아 노래해",
        "손을 잡고 {region}에서",
        "{name}, {name}",
    ),
    bridges=(
        "시간이 흘러가도",
        "잊지 못할 {noun}",
        "{phrase}",
        "다시 여기 {region}",
        "{adj} 꿈을 꾸던 밤",
        "언젠가 또 만나요",
        "마음속에 {name}",
    ),
    moods={
        brief.Style.KPOP: Mood(
            ("반짝이는", "설레는", "눈부신", "두근대는"),
            ("햇살", "별빛", "리듬", "무지개"),
            ("오늘 밤", "이번 주말", "지금 이 순간"),
            ("예이예", "랄랄라", "오오오"),
        ),
        brief.Style.BALLAD: Mood(
            ("그리운", "따스한", "잔잔한", "포근한"),
            ("노을", "추억", "달빛", "바람"),
            ("해 질 무렵", "조용한 밤", "어느 저녁"),
            ("음음", "오오"),
        ),
        brief.Style.HIPHOP: Mood(
            ("거침없는", "뜨거운", "자유로운", "당당한"),
            ("비트", "에너지", "리듬", "골목"),
            ("오늘 밤", "지금 당장", "매일 매일"),
            ("예", "렛츠 고", "요"),
        ),
        brief.Style.ROCK: Mood(
            ("뜨거운", "힘찬", "거침없는", "끝없는"),
            ("함성", "불꽃", "바람", "질주"),
            ("이 밤", "지금", "밤새도록"),
            ("헤이", "워어", "예"),
        ),
        brief.Style.JAZZ: Mood(
            ("느긋한", "은은한", "낭만적인", "부드러운"),
            ("선율", "커피 향", "달빛", "밤공기"),
            ("늦은 밤", "어느 저녁", "비 오는 날"),
            ("두비두바", "샤바다", "음"),
        ),
        brief.Style.TROT: Mood(
            ("정다운", "흥겨운", "구성진", "신나는"),
            ("인연", "사랑", "웃음꽃", "정"),
            ("오늘 하루", "이 밤", "좋은 날"),
            ("얼씨구", "좋다 좋아", "어기야"),
        ),
        brief.Style.ACOUSTIC: Mood(
            ("소박한", "싱그러운", "포근한", "맑은"),
            ("햇살", "바람", "기타 소리", "풀내음"),
            ("아침 햇살 속", "주말 오후", "산책길"),
            ("라라라", "음", "랄라"),
        ),
    },
)

ENGLISH = Phrasebook(
    max_chars=40,
    titles=("{name} Song", "Hello, {name}", "{region} Days at {name}", "Meet Me at {name}", "{adj} {name}"),
    openers=(
        "Down the streets of {region}",
        "{time} in {region}",
        "Where the {noun} meets {region}",
        "Take me back to {region}",
        "{adj} days in {region}",
        "There's a place in {region}",
        "{region} is calling me",
    ),
    details=(
        "{phrase}",
        "{phrase}, that's where I'll be",
        "{phrase}, come and see",
        "Come and find the {kw}",
        "Good friends and {kw}",
        "All the {kw} you need",
        "{kw} and {noun}, {time}",
    ),
    verses=(
        "Every {noun} leads me there",
        "{adj} hearts and {noun}",
        "Open doors at {name}",
        "Slow down, stay a while",
        "Under the {adj} {noun}",
        "A little {noun} every day",
        "{time} and we're alive",
        "Step inside {name}",
        "Leave your worries at the door",
        "Smiles on every face",
    ),
    hooks=(
        "{call}, {name}",
        "Meet me at {name}",
        "{name}, {name}",
        "{region}'s own {name}",
        "Here at {name}, {time}",
        "Come on down to {name}",
        "Oh {name}, take me home",
    ),
    choruses=(
        "{adj} and free in {region}",
        "We sing it loud, {call}",
        "Every day's a {adj} day",
        "{kw} and you and me",
        "This is where we belong",
        "Light it up, {region}",
        "Nowhere else I'd rather be",
        "Hold on to this {noun}",
    ),
    bridges=(
        "When the {noun} fades away",
        "{phrase}",
        "Remember {region}",
        "We'll come back, we always do",
        "{adj} dreams at {name}",
        "Just one more {noun}",
    ),
    moods={
        brief.Style.KPOP: Mood(
            ("shining", "electric", "sparkling", "brand new"),
            ("sunlight", "starlight", "rhythm", "rainbow"),
            ("tonight", "this weekend", "right now"),
            ("oh-oh", "la-la", "hey hey"),
        ),
        brief.Style.BALLAD: Mood(
            ("tender", "golden", "quiet", "gentle"),
            ("sunset", "memory", "moonlight", "breeze"),
            ("at dusk", "late at night", "this evening"),
            ("oh", "ooh"),
        ),
        brief.Style.HIPHOP: Mood(
            ("bold", "fresh", "wild", "real"),
            ("beat", "groove", "energy", "block"),
            ("tonight", "all day", "every day"),
            ("yeah", "uh", "let's go"),
        ),
        brief.Style.ROCK: Mood(
            ("burning", "loud", "restless", "endless"),
            ("fire", "thunder", "highway", "roar"),
            ("tonight", "right now", "all night"),
            ("hey", "whoa", "oh yeah"),
        ),
        brief.Style.JAZZ: Mood(
            ("mellow", "smoky", "velvet", "easy"),
            ("melody", "coffee", "moonlight", "night air"),
            ("after hours", "late tonight", "this evening"),
            ("doo-bee-doo", "ba-da", "oh"),
        ),
        brief.Style.TROT: Mood(
            ("cheerful", "joyful", "lively", "warm"),
            ("fortune", "love", "laughter", "good times"),
            ("all day long", "tonight", "this season"),
            ("hey", "ya-ho", "oh-ho"),
        ),
        brief.Style.ACOUSTIC: Mood(
            ("simple", "fresh", "gentle", "bright"),
            ("sunshine", "breeze", "guitar", "meadow"),
            ("this morning", "all afternoon", "on Sunday"),
            ("la-la", "hmm", "oh"),
        ),
    },
)

JAPANESE = Phrasebook(
    max_chars=16,
    titles=("{region}の{name}", "{name}のうた", "{adj}{name}", "こんにちは、{name}", "{region}、{name}"),
    openers=(
        "{region}に{noun}が降れば",
        "{adj}{region}の{time}",
        "{region}の風に誘われて",
        "たどり着いたよ{region}",
        "{time}、{region}で",
        "{region}の路地の先",
        "{region}へ行こう",
        "{region}の{noun}をたどって",
    ),
    details=(
        "{phrase}",
        "{phrase}、そこで会おう",
        "{phrase}、あの場所へ",
        "{kw}が待つところ",
        "{kw}と過ごす{time}",
        "{kw}の物語",
        "{kw}、そして{noun}",
        "{adj}{kw}に会いに",
    ),
    verses=(
        "{adj}{noun}をたどって",
        "{adj}一日の終わりに",
        "窓の外には{noun}",
        "心が先に着く場所",
        "{noun}が休む場所",
        "{name}の扉を開けば",
        "{name}でひと休み",
        "一緒に歩こう",
        "{noun}の下で笑顔",
        "また来たい場所",
        "{adj}思い出ひとつ",
        "少し休んでいこう",
    ),
    hooks=(
        "{call}、{name}",
        "{region}には{name}",
        "今日も{name}で会おう",
        "{adj}場所{name}",
        "{name}へおいでよ",
        "{region}の誇り{name}",
        "いつでも{name}",
        "ここが{name}",
    ),
    choruses=(
        "{name}と一緒なら",
        "{region}で会いましょう",
        "{call}{call}",
        "{adj}今日を歌おう",
        "{kw}と君と僕",
        "帰っておいで{region}",
        "僕らの{adj}時間",
        "{noun}をこめて歌おう",
        "手をつないで{region}で",
        "{name}、{name}",
    ),
    bridges=(
        "時が流れても",
        "忘れられない{noun}",
        "{phrase}",
        "もう一度ここ{region}",
        "{adj}夢を見た夜",
        "いつかまた会おう",
        "心の中に{name}",
    ),
    moods={
        brief.Style.KPOP: Mood(
            ("きらめく", "ときめく", "まぶしい", "弾ける"),
            ("光", "星空", "リズム", "虹"),
            ("今夜", "この週末", "今この瞬間"),
            ("イェイイェイ", "ラララ", "オーオー"),
        ),
        brief.Style.BALLAD: Mood(
            ("なつかしい", "あたたかい", "静かな", "やさしい"),
            ("夕焼け", "思い出", "月明かり", "風"),
            ("夕暮れ", "夜更け", "今宵"),
            ("ラララ", "ウー"),
        ),
        brief.Style.HIPHOP: Mood(
            ("熱い", "新しい", "ワイルドな", "リアルな"),
            ("ビート", "グルーヴ", "エナジー", "ストリート"),
            ("今夜", "一日中", "毎日"),
            ("イェー", "ヘイ", "レッツゴー"),
        ),
        brief.Style.ROCK: Mood(
            ("燃える", "響く", "止まらない", "果てしない"),
            ("炎", "雷", "ハイウェイ", "叫び"),
            ("今夜", "今すぐ", "夜通し"),
            ("ヘイ", "ウォー", "オーイェー"),
        ),
        brief.Style.JAZZ: Mood(
            ("甘い", "ほろ苦い", "ゆるやかな", "しっとりした"),
            ("メロディー", "コーヒー", "月明かり", "夜風"),
            ("真夜中", "今夜遅く", "この夜"),
            ("ドゥビドゥ", "バダ", "オー"),
        ),
        brief.Style.TROT: Mood(
            ("陽気な", "楽しい", "にぎやかな", "あたたかい"),
            ("福", "恋", "笑い声", "いい時間"),
            ("一日中", "今夜", "この季節"),
            ("ヘイ", "ヤッホー", "ソレ"),
        ),
        brief.Style.ACOUSTIC: Mood(
            ("素朴な", "さわやかな", "やさしい", "明るい"),
            ("陽だまり", "そよ風", "ギター", "野原"),
            ("朝", "昼下がり", "日曜日"),
            ("ラララ", "フフン", "オー"),
        ),
    },
)

CHINESE = Phrasebook(
    max_chars=14,
    titles=("{region}的{name}", "{name}之歌", "{adj}{name}", "你好，{name}", "{region}，{name}"),
    openers=(
        "走在{region}的街头",
        "{region}的{time}",
        "{region}的风吹过来",
        "来到了{region}",
        "{time}，在{region}",
        "{region}小巷的尽头",
        "一起去{region}",
        "沿着{region}的{noun}",
    ),
    details=(
        "{phrase}",
        "{phrase}，在那里相见",
        "{phrase}，就在那里",
        "{kw}在等着你",
        "和{kw}一起的{time}",
        "满是{kw}的故事",
        "{kw}，还有{noun}",
        "去见{adj}{kw}",
    ),
    verses=(
        "追着{adj}{noun}",
        "{adj}一天的尽头",
        "窗外是{noun}",
        "心先到达的地方",
        "{noun}停留的地方",
        "推开{name}的门",
        "在{name}歇一歇",
        "我们一起走",
        "{noun}下的笑容",
        "还想再来的地方",
        "{adj}回忆一个个",
        "停下来歇一会",
    ),
    hooks=(
        "{call}，{name}",
        "{region}有{name}",
        "今天也在{name}见",
        "{adj}地方{name}",
        "快来{name}吧",
        "{region}的骄傲{name}",
        "随时都在{name}",
        "这里就是{name}",
    ),
    choruses=(
        "和{name}在一起",
        "在{region}相见",
        "{call}{call}",
        "歌唱{adj}今天",
        "{kw}和你和我",
        "回到{region}来",
        "我们{adj}时光",
        "把{noun}唱进歌里",
        "牵着手在{region}",
        "{name}，{name}",
    ),
    bridges=(
        "就算时光流逝",
        "难忘的{noun}",
        "{phrase}",
        "再一次来到{region}",
        "{adj}梦的夜晚",
        "总有一天再相见",
        "心中的{name}",
    ),
    moods={
        brief.Style.KPOP: Mood(
            ("闪亮的", "心动的", "耀眼的", "跳动的"),
            ("阳光", "星光", "节奏", "彩虹"),
            ("今晚", "这个周末", "此时此刻"),
            ("耶耶", "啦啦啦", "哦哦哦"),
        ),
        brief.Style.BALLAD: Mood(
            ("思念的", "温暖的", "宁静的", "温柔的"),
            ("晚霞", "回忆", "月光", "微风"),
            ("黄昏", "深夜", "今夜"),
            ("啦啦啦", "呜"),
        ),
        brief.Style.HIPHOP: Mood(
            ("大胆的", "新鲜的", "狂野的", "真实的"),
            ("节拍", "律动", "能量", "街头"),
            ("今晚", "一整天", "每一天"),
            ("耶", "嘿", "走吧"),
        ),
        brief.Style.ROCK: Mood(
            ("燃烧的", "响亮的", "不停的", "无尽的"),
            ("火焰", "雷声", "公路", "呐喊"),
            ("今晚", "现在", "整夜"),
            ("嘿", "哇哦", "哦耶"),
        ),
        brief.Style.JAZZ: Mood(
            ("醇厚的", "慵懒的", "丝绒般的", "轻松的"),
            ("旋律", "咖啡", "月光", "夜风"),
            ("午夜", "今晚", "这个夜晚"),
            ("嘟比嘟", "叭哒", "哦"),
        ),
        brief.Style.TROT: Mood(
            ("欢快的", "快乐的", "热闹的", "温暖的"),
            ("福气", "爱情", "笑声", "好时光"),
            ("一整天", "今晚", "这个季节"),
            ("嘿", "呀吼", "哦吼"),
        ),
        brief.Style.ACOUSTIC: Mood(
            ("朴素的", "清新的", "温柔的", "明亮的"),
            ("阳光", "微风", "吉他", "草地"),
            ("清晨", "午后", "星期天"),
            ("啦啦", "嗯哼", "哦"),
        ),
    },
)

_PHRASEBOOKS = {
    brief.Language.KOREAN: KOREAN,
    brief.Language.ENGLISH: ENGLISH,
    brief.Language.JAPANESE: JAPANESE,
    brief.Language.CHINESE: CHINESE,
}

_PHRASE_SPLIT = {
    brief.Language.KOREAN: re.compile(r"[,.;:!?·/\n]+|\s+그리고\s+|\s+및\s+"),
    brief.Language.ENGLISH: re.compile(r"[,.;:!?/\n]+|\s+and\s+", re.IGNORECASE),
    brief.Language.JAPANESE: re.compile(r"[、。,.;:!?！？・「」/\n\s]+"),
    brief.Language.CHINESE: re.compile(r"[，。、,.;:!?！？；：/\n\s]+"),
}
# Noun-like runs of Han characters or katakana, the keywords of Japanese and Chinese free text.
_HAN_OR_KATAKANA = re.compile(r"[\u4e00-\u9fff\u30a0-\u30ff]{2,8}")
_CHINESE_FUNCTION_CHARS = re.compile(r"[的和与在有是了也都就还很一个]")

_ENGLISH_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "by",
        "from",
        "with",
        "our",
        "your",
        "their",
        "its",
        "is",
        "are",
        "be",
        "near",
        "very",
        "just",
        "only",
        "also",
        "this",
        "that",
        "these",
        "those",
        "there",
        "here",
        "it",
        "we",
        "you",
        "they",
        "has",
        "have",
        "all",
    ]
)
_KOREAN_MODIFIER_ENDINGS = tuple("는은한운인된던고며서다요게면")
_KOREAN_PARTICLES = ("에서", "으로", "까지", "부터", "처럼", "이", "가", "을", "를", "의", "에", "도", "와", "과", "로")
_PARTICLE_AFTER_BATCHIM = {"이": True, "가": False, "을": True, "를": False, "과": True, "와": False}

_HANGUL_FIRST, _HANGUL_LAST = 0xAC00, 0xD7A3
_RIEUL_FINAL = 8
_DIGIT_FINALS = {"0": 21, "1": 8, "3": 16, "6": 1, "7": 8, "8": 8}
_LATIN_FINALS = {"l": 8, "m": 16, "n": 4}

# particle spec -> (after a final consonant, after a vowel)
_JOSA = {
    "이": ("이", "가"),
    "은": ("은", "는"),
    "을": ("을", "를"),
    "과": ("과", "와"),
    "아": ("아", "야"),
    "이야": ("이야", "야"),
    "으로": ("으로", "로"),
}


def final_consonant(word: str) -> int:
    """Index of the final consonant (jongseong) of the word's last sound; 0 when it ends in a vowel."""
    for char in reversed(word):
        if _HANGUL_FIRST <= ord(char) <= _HANGUL_LAST:
            return (ord(char) - _HANGUL_FIRST) % 28
        if char.isdigit():
            return _DIGIT_FINALS.get(char, 0)
        if char.isalpha():
            return _LATIN_FINALS.get(char.lower(), 0)
    return 0


def with_particle(word: str, spec: str) -> str:
    """Append the Korean particle named by spec ("이", "은", "을", "과", "아", "이야", "으로")."""
    after_consonant, after_vowel = _JOSA[spec]
    final = final_consonant(word)
    if spec == "으로" and final == _RIEUL_FINAL:
        return word + after_vowel
    return word + (after_consonant if final else after_vowel)


class _ParticleFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> Any:
        if format_spec in _JOSA:
            return with_particle(str(value), format_spec)
        return super().format_field(value, format_spec)


_FORMATTER = _ParticleFormatter()


def slots(template: str) -> tuple[str, ...]:
    """The template's fields, each once, in the order they stand.

    Filled in that order, a seed gives the same lyrics in every process (a set's order changes with each process's
    hash seed).
    """
    return tuple(dict.fromkeys(field for _, field, _, _ in _FORMATTER.parse(template) if field))


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """What a template's slots may be filled with."""

    name: str
    region: str
    phrases: tuple[str, ...]
    keywords: tuple[str, ...]
    mood: Mood

    def options(self, slot: str) -> tuple[str, ...]:
        by_slot: dict[str, tuple[str, ...]] = {
            "name": (self.name,),
            "region": (self.region,),
            "phrase": self.phrases,
            "kw": self.keywords or self.mood.nouns,
            "adj": self.mood.adjectives,
            "noun": self.mood.nouns,
            "time": self.mood.times,
            "call": self.mood.calls,
        }
        return by_slot[slot]


def _dedupe(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for item in items if item))


def _chunk(words: Sequence[str], max_chars: int) -> list[str]:
    chunks: list[str] = []
    current = ""
    for word in words:
        candidate = f"{current} {word}".strip()
        if current and len(candidate) > max_chars:
            chunks.append(current)
            current = word
        else:
            current = candidate
    if current:
        chunks.append(current)
    return chunks


def phrases(detail: str, language: brief.Language, max_chars: int) -> tuple[str, ...]:
    """Split free text into short singable phrases."""
    parts = (part.strip() for part in _PHRASE_SPLIT[language].split(detail))
    chunks = [chunk for part in parts if part for chunk in _chunk(part.split(), max_chars)]
    return _dedupe(chunks)[:MAX_PHRASES]


def _korean_keyword(word: str) -> str:
    for particle in _KOREAN_PARTICLES:
        stem = word[: -len(particle)]
        if not word.endswith(particle) or len(stem) < 2:
            continue
        needs_batchim = _PARTICLE_AFTER_BATCHIM.get(particle)
        if needs_batchim is None or needs_batchim == bool(final_consonant(stem)):
            return stem
    return "" if word.endswith(_KOREAN_MODIFIER_ENDINGS) else word


def keywords(detail: str, language: brief.Language) -> tuple[str, ...]:
    """Pick the noun-like words of free text, stripped of particles."""
    if language == brief.Language.JAPANESE:
        return _dedupe(_HAN_OR_KATAKANA.findall(detail))[:MAX_KEYWORDS]
    if language == brief.Language.CHINESE:
        runs = (run for part in _PHRASE_SPLIT[language].split(detail) for run in _CHINESE_FUNCTION_CHARS.split(part))
        return _dedupe([run for run in runs if 2 <= len(run) <= 6])[:MAX_KEYWORDS]
    words = re.findall(r"[\w'-]+", detail)
    if language == brief.Language.KOREAN:
        found = [_korean_keyword(word) for word in words]
        found = [word for word in found if 2 <= len(word) <= 8]
    else:
        found = [word for word in words if len(word) >= 3 and word.lower() not in _ENGLISH_STOPWORDS]
    return _dedupe(found)[:MAX_KEYWORDS]


def structure(duration_s: int) -> tuple[SectionKind, ...]:
    """The order of sections: longer songs get a bridge and a third verse."""
    if duration_s >= 100:
        return ("verse", "chorus", "verse", "chorus", "bridge", "verse", "chorus")
    if duration_s >= 45:
        return ("verse", "chorus", "verse", "chorus", "bridge", "chorus")
    return ("verse", "chorus", "verse", "chorus")


def lines_per_section(duration_s: int, sections: int) -> int:
    target = round(duration_s / SECONDS_PER_LINE / sections)
    return max(MIN_LINES_PER_SECTION, min(MAX_LINES_PER_SECTION, target))


class _Writer:
    """Fills templates with the vocabulary, never repeating a line within a song."""

    def __init__(self, book: Phrasebook, vocabulary: Vocabulary, rng: random.Random) -> None:
        self._book = book
        self._vocabulary = vocabulary
        self._rng = rng
        self._used_lines: set[str] = set()
        self._used_templates: set[str] = set()

    def line(self, templates: Sequence[str]) -> str:
        usable = [t for t in templates if all(self._vocabulary.options(s) for s in slots(t))]
        fresh = [t for t in usable if t not in self._used_templates]
        stale = [t for t in usable if t in self._used_templates]
        ordered = self._rng.sample(fresh, len(fresh)) + self._rng.sample(stale, len(stale))
        candidates = [(template, self._fill(template)) for template in ordered]
        fitting = [(t, line) for t, line in candidates if len(line) <= self._book.max_chars]
        unseen = [(t, line) for t, line in fitting if line not in self._used_lines]
        template, line = (unseen or fitting or sorted(candidates, key=lambda c: len(c[1])))[0]
        self._used_templates.add(template)
        self._used_lines.add(line)
        return line

    def _fill(self, template: str) -> str:
        values = {slot: self._rng.choice(self._vocabulary.options(slot)) for slot in slots(template)}
        text = _FORMATTER.format(template, **values)
        return text[:1].upper() + text[1:]


def _verse(writer: _Writer, book: Phrasebook, count: int) -> tuple[str, ...]:
    rest = [writer.line(book.verses + book.details) for _ in range(count - 2)]
    return (writer.line(book.openers), writer.line(book.details), *rest)


def _chorus(writer: _Writer, book: Phrasebook, count: int) -> tuple[str, ...]:
    middle = [writer.line(book.choruses) for _ in range(count - 1 - (count >= 4))]
    closing = [writer.line(book.hooks)] if count >= 4 else []
    return (writer.line(book.hooks), *middle, *closing)


def _bridge(writer: _Writer, book: Phrasebook, count: int) -> tuple[str, ...]:
    return tuple(writer.line(book.bridges) for _ in range(count))


class LocalLyricProvider:
    """Writes lyrics offline from phrase templates, deterministically for a seed."""

    def write(
        self,
        brief: brief.Brief,
        seed: str,
        cancel: cancellation.Cancellation | None = None,
        attempt: int = 1,
        note: str | None = None,
    ) -> events.Lyrics:
        book = _PHRASEBOOKS[brief.language]
        vocabulary = Vocabulary(
            name=brief.customer_name,
            region=brief.region,
            phrases=phrases(brief.detail_region_info, brief.language, book.max_chars),
            keywords=keywords(brief.detail_region_info, brief.language),
            mood=book.moods[brief.style],
        )
        writer = _Writer(book, vocabulary, random.Random(seed))
        kinds = structure(brief.duration_s)
        count = lines_per_section(brief.duration_s, len(kinds))
        title = writer.line(book.titles)
        chorus = _chorus(writer, book, count)
        sections = [
            events.LyricSection(kind=kind, lines=chorus if kind == "chorus" else self._lines(writer, book, kind, count))
            for kind in kinds
        ]
        return events.Lyrics(title=title, language=brief.language, sections=tuple(sections))

    @staticmethod
    def _lines(writer: _Writer, book: Phrasebook, kind: SectionKind, count: int) -> tuple[str, ...]:
        return _bridge(writer, book, count) if kind == "bridge" else _verse(writer, book, count)
