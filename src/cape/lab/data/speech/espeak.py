"""The espeak-ng speech synthesiser through its C library (ctypes), one engine per process.

The library (Debian `libespeak-ng1`, header /usr/include/espeak-ng/speak_lib.h) is loaded into
the process and initialised in AUDIO_OUTPUT_SYNCHRONOUS mode: `espeak_Synth` returns when the whole
text has been spoken, having handed int16 samples and events (word starts) to our callback. No
process is started per utterance. The library keeps global state, so an `Espeak` is a
per-process singleton (`get_espeak`) and is not thread-safe. For reproducible audio it is
reloaded before each utterance (see `Espeak`).
"""

from __future__ import annotations

import _ctypes
import ctypes
import ctypes.util
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cape._checks import check_int

__all__ = ["Espeak", "Synthesis", "espeak_available", "get_espeak"]

_LIBRARY_NAMES = ("libespeak-ng.so.1", "libespeak-ng.so")
# speak_lib.h constants (API revision 12)
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_EVENT_LIST_TERMINATED = 0
_EVENT_WORD = 1
_EE_OK = 0
_PARAMETERS = {"rate": 1, "volume": 2, "pitch": 3, "range": 4}
RATE_RANGE = (80, 450)  # espeakRATE_MINIMUM, espeakRATE_MAXIMUM, words per minute


_ENGINE: Espeak | None = None


class _Event(ctypes.Structure):
    """espeak_EVENT."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # 1-based character offset of the word
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # milliseconds from the start of the output
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),  # a union of int, const char* and char[8]
    ]


_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


@dataclass(frozen=True)
class Synthesis:
    """What espeak said: `samples` int16 [N] at `sample_rate` Hz, and for each word of the text
    (split on spaces) its start time in seconds, or None when espeak gave it no word event."""

    samples: np.ndarray
    sample_rate: int
    word_starts: list[float | None]

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return len(self.samples) / self.sample_rate


_LIBRARY_NAME: list[str] = []  # the name that loaded, once found


def _load_library() -> ctypes.CDLL | None:
    names = _LIBRARY_NAME or list(_LIBRARY_NAMES)
    for attempt in range(2):
        for name in names:
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            _LIBRARY_NAME[:] = [name]
            return lib
        found = ctypes.util.find_library("espeak-ng") if attempt == 0 else None
        if not found:
            break
        names = [found]
    return None


def _unload(lib: ctypes.CDLL) -> None:
    """dlclose `lib` and check that it is really gone (no other handle keeps it loaded)."""
    _ctypes.dlclose(lib._handle)
    try:
        still = _ctypes.dlopen(_LIBRARY_NAME[0], os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return  # unloaded: the next dlopen starts from fresh static variables
    _ctypes.dlclose(still)
    raise RuntimeError(
        "libespeak-ng stays loaded after dlclose (another ctypes handle holds it), so its "
        "synthesis state cannot be reset: use only cape.lab.data.speech.espeak.get_espeak() "
        "in this process"
    )


def _aliased_data(system: Path) -> Path | None:
    """A folder whose espeak-ng-data mirrors `system` with symlinks, where each voice file of
    lang/ is also found under its lower-case name, both in place and at the top of lang/
    ("lang/en-us" -> "lang/gmw/en-US"). espeak_SetVoiceByName lower-cases the name and first
    tries lang/<name>; without such a file it lists every voice (~4 ms, paid on every utterance
    since the library is reloaded). Made once per machine in the temp folder; None on failure."""
    try:
        stamp = f"{system.resolve()}:{(system / 'phondata').stat().st_mtime_ns}"
        digest = hashlib.sha1(stamp.encode()).hexdigest()[:12]
        root = Path(tempfile.gettempdir()) / f"cape-espeak-{os.getuid()}-{digest}"
        if (root / "espeak-ng-data" / ".complete").is_file():
            return root
        tmp = Path(tempfile.mkdtemp(prefix=f"{root.name}.", dir=root.parent))
        data = tmp / "espeak-ng-data"
        data.mkdir()
        for entry in system.iterdir():
            if entry.name != "lang":
                (data / entry.name).symlink_to(entry.resolve())
        lang = data / "lang"
        for src in sorted((system / "lang").rglob("*")):
            if src.is_dir():
                continue
            rel = src.relative_to(system / "lang")
            (lang / rel).parent.mkdir(parents=True, exist_ok=True)
            (lang / rel).symlink_to(src.resolve())
            for alias in (lang / rel.parent / src.name.lower(), lang / src.name.lower()):
                if not alias.exists() and not alias.is_symlink():
                    alias.symlink_to(src.resolve())
        (data / ".complete").touch()
        try:
            os.rename(tmp, root)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
        return root if (root / "espeak-ng-data" / ".complete").is_file() else None
    except OSError:
        return None


def espeak_available() -> bool:
    """True when libespeak-ng can be loaded (Debian packages espeak-ng / libespeak-ng1)."""
    if _ENGINE is not None and _ENGINE._pid == os.getpid():
        return True
    lib = _load_library()
    if lib is None:
        return False
    _ctypes.dlclose(lib._handle)  # leave no handle behind: Espeak must be able to unload it
    return True


class Espeak:
    """The espeak-ng library in synchronous retrieval mode. Use `get_espeak()`, not this class:
    the library has one global state per process.

    espeak-ng keeps synthesis state in static variables (glottal phase, pitch-flutter index,
    ...) that no API call resets, so the samples of an utterance depend on what was spoken before
    it. With `deterministic=True` (the default) the library is unloaded and loaded afresh
    (dlclose/dlopen + espeak_Initialize, ~5 ms) before every utterance, and libc's `rand` (breath
    noise) is seeded: the same arguments then give the same samples in any process, in any order.
    """

    def __init__(self, data_path: str | None = None, *, deterministic: bool = True) -> None:
        # data_path: the folder holding espeak-ng-data; None: the library's own, seen through
        # `_aliased_data` (same files, faster voice selection)
        self._data_path = None if data_path is None else str(data_path).encode()
        self.deterministic = bool(deterministic)
        self._pid = os.getpid()
        self._chunks: list[np.ndarray] = []
        self._words: list[tuple[int, float]] = []  # (0-based character offset, seconds)
        self._callback = _CALLBACK(self._collect)  # keep a reference: the library holds a pointer
        self._libc = ctypes.CDLL(None)  # the process's C library, for srand
        self._lib: ctypes.CDLL | None = None
        self._voice: str | None = None
        self._load()
        if data_path is None:
            info_path = ctypes.c_char_p()
            assert self._lib is not None
            self._lib.espeak_Info(ctypes.byref(info_path))
            aliased = _aliased_data(Path(info_path.value.decode())) if info_path.value else None
            if aliased is not None:
                self._data_path = str(aliased).encode()
                self._load()

    def _load(self) -> None:
        """(Re)load libespeak-ng, initialise it and register our callback."""
        if self._lib is not None:
            lib, self._lib = self._lib, None
            lib.espeak_Terminate()  # frees what espeak_Initialize allocated
            _unload(lib)  # the next dlopen gets fresh static variables
        lib = _load_library()
        if lib is None:
            raise OSError(
                "libespeak-ng is not installed: apt-get install espeak-ng libespeak-ng1 "
                "(scripts/setup.sh does)"
            )
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_CALLBACK]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.POINTER(ctypes.c_uint),
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_Synchronize.argtypes = []
        lib.espeak_Synchronize.restype = ctypes.c_int
        lib.espeak_Info.argtypes = [ctypes.POINTER(ctypes.c_char_p)]
        lib.espeak_Info.restype = ctypes.c_char_p
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, self._data_path, _INITIALIZE_DONT_EXIT
        )
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed (returned {rate})")
        lib.espeak_SetSynthCallback(self._callback)
        self.sample_rate = int(rate)
        self._lib = lib
        self._voice = None

    def _collect(self, wav, n, events) -> int:  # called by the library during espeak_Synth
        if n > 0 and wav:
            self._chunks.append(np.frombuffer(ctypes.string_at(wav, 2 * n), dtype=np.int16))
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            if events[i].type == _EVENT_WORD:
                ev = events[i]
                self._words.append((ev.text_position - 1, ev.audio_position / 1000.0))
            i += 1
        return 0  # 0: continue synthesis

    def set_voice(self, voice: str) -> None:
        """Select a voice by name: a language ("en-us", "en-gb-scotland"; British English is
        "en") optionally with a variant ("en-us+m3", "en-029+f2"). Raises ValueError naming an
        unknown voice."""
        assert self._lib is not None
        if voice == self._voice:
            return
        if not isinstance(voice, str) or self._lib.espeak_SetVoiceByName(voice.encode()) != _EE_OK:
            raise ValueError(f"espeak-ng has no voice {voice!r} (see `espeak-ng --voices=en`)")
        self._voice = voice

    def _set(self, name: str, value: int) -> None:
        assert self._lib is not None
        if self._lib.espeak_SetParameter(_PARAMETERS[name], value, 0) != _EE_OK:
            raise RuntimeError(f"espeak_SetParameter({name}={value}) failed")

    def synthesize(
        self,
        text: str,
        *,
        voice: str = "en-us",
        rate: int = 175,
        pitch: int = 50,
        range_: int = 50,
        seed: int = 0,
    ) -> Synthesis:
        """Speak `text` with `voice` at `rate` words per minute (80-450), base `pitch` (0-100) and
        pitch `range_` (0-100, 0 monotone); `seed` (>= 0) seeds espeak's breath noise. With
        `deterministic`, the same arguments give the same samples."""
        if os.getpid() != self._pid:
            raise RuntimeError("an Espeak engine cannot be used in a forked process: get_espeak()")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"text must be a non-empty string, got {text!r}")
        check_int("rate", rate, minimum=RATE_RANGE[0])
        if rate > RATE_RANGE[1]:
            raise ValueError(f"rate must be in [{RATE_RANGE[0]}, {RATE_RANGE[1]}] wpm, got {rate}")
        for name, value in (("pitch", pitch), ("range_", range_)):
            check_int(name, value, minimum=0)
            if value > 100:
                raise ValueError(f"{name} must be in [0, 100], got {value}")
        check_int("seed", seed, minimum=0)
        if self.deterministic:
            self._load()
        self.set_voice(voice)
        self._set("rate", rate)
        self._set("pitch", pitch)
        self._set("range", range_)
        self._set("volume", 100)
        self._libc.srand(ctypes.c_uint(seed & 0xFFFFFFFF))
        self._chunks, self._words = [], []
        data = text.encode("utf-8")
        buf = ctypes.create_string_buffer(data)
        assert self._lib is not None
        status = self._lib.espeak_Synth(
            buf, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
        )
        if status != _EE_OK or self._lib.espeak_Synchronize() != _EE_OK:
            raise RuntimeError(f"espeak_Synth failed (status {status}) for text {text[:60]!r}")
        samples = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        self._chunks = []
        return Synthesis(samples, self.sample_rate, _word_starts(text, self._words))


def _word_starts(text: str, events: list[tuple[int, float]]) -> list[float | None]:
    """Start time of each space-separated word of `text`, from (character offset, time) events
    whose offset is a word's first character (UTF-8 text: offsets count characters)."""
    offsets: dict[int, int] = {}
    pos = 0
    for index, word in enumerate(text.split(" ")):
        if word:
            offsets[pos] = index
        pos += len(word) + 1
    n_words = len(text.split(" "))
    starts: list[float | None] = [None] * n_words
    for offset, seconds in events:
        index = offsets.get(offset)
        if index is not None and starts[index] is None:
            starts[index] = seconds
    return [s for s, w in zip(starts, text.split(" "), strict=True) if w]


def get_espeak() -> Espeak:
    """The process's (deterministic) espeak-ng engine, made on first use and again after a fork."""
    global _ENGINE
    if _ENGINE is not None and _ENGINE._pid != os.getpid():
        # forked: drop the handle inherited from the parent, or the library could not be
        # unloaded (its copy of the parent's state is simply left behind)
        if _ENGINE._lib is not None:
            _ctypes.dlclose(_ENGINE._lib._handle)
            _ENGINE._lib = None
        _ENGINE = None
    if _ENGINE is None:
        _ENGINE = Espeak()
    return _ENGINE
