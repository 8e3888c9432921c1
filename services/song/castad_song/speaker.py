"""Speak phrases with Debian's eSpeak NG library in a process of its own; print audio and phoneme times.

Run as `python -m castad_song.speaker '[["ko+f3", "text"], ...]'` (or `--check` with voice names).
Only the library reports each phoneme with its time in the audio, which the singing voice needs
to find the vowels; the `espeak-ng` program does not. A process per song, because the library
keeps state from one utterance to the next (the same phrase spoken twice differs slightly) and is
not thread-safe: a fresh one makes the same song twice, and concurrent songs never meet. It also
keeps the GPL-3 library out of the service's own process. Standard library only: it starts fast.
"""

from __future__ import annotations

import base64
import ctypes
import json
import sys

LIBRARY = "libespeak-ng.so.1"
_SYNCHRONOUS = 2  # AUDIO_OUTPUT_SYNCHRONOUS: the callback gets every sample before espeak_Synth returns
_PHONEME_EVENTS = 0x0001  # espeakINITIALIZE_PHONEME_EVENTS
_FLAGS = 0x1 | 0x100  # espeakCHARS_UTF8 | espeakPHONEMES ([[...]] in the text is phoneme input)
_POS_CHARACTER = 1
_EVENT_END, _EVENT_PHONEME = 0, 7
_BUFFER_MS = 200


class _Id(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    """espeak_EVENT of speak_lib.h."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", _Id),
    ]


_Callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


def main(argv: list[str]) -> int:
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as error:
        print(json.dumps({"error": f"cannot load {LIBRARY}: {error}"}))
        return 1
    rate = int(lib.espeak_Initialize(_SYNCHRONOUS, _BUFFER_MS, None, _PHONEME_EVENTS))
    if rate <= 0:
        print(json.dumps({"error": f"eSpeak NG found no data ({rate})"}))
        return 1
    if argv[:1] == ["--check"]:
        missing = [name for name in argv[1:] if lib.espeak_SetVoiceByName(name.encode()) != 0]
        print(json.dumps({"rate": rate, "missing": missing}))
        return 0
    audio = bytearray()
    phonemes: list[tuple[str, float]] = []

    def receive(wav: ctypes._Pointer[ctypes.c_short], count: int, events: ctypes._Pointer[_Event]) -> int:
        if count > 0:
            audio.extend(ctypes.string_at(wav, 2 * count))
        index = 0
        while events[index].type != _EVENT_END:
            event = events[index]
            if event.type == _EVENT_PHONEME:
                phonemes.append((event.id.string.decode("utf-8", "replace"), event.audio_position / 1000.0))
            index += 1
        return 0

    callback = _Callback(receive)
    lib.espeak_SetSynthCallback(callback)
    for voice, text in json.loads(argv[0]):
        if lib.espeak_SetVoiceByName(voice.encode()) != 0:
            print(json.dumps({"error": f"eSpeak NG has no voice {voice!r}"}))
            return 1
        audio.clear()
        phonemes.clear()
        encoded = text.encode()
        lib.espeak_Synth(encoded, len(encoded) + 1, 0, _POS_CHARACTER, 0, _FLAGS, None, None)
        lib.espeak_Synchronize()
        samples = base64.b64encode(bytes(audio)).decode()
        print(json.dumps({"rate": rate, "phonemes": phonemes, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
