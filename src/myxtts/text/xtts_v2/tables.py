"""XTTS-v2's per-language word lists: the languages, their character limits, abbreviations,
symbol names, ordinal suffixes and the currency words, as the released model's text front
end (coqui-tts 0.28) has them.

These are facts the model was trained with: a different expansion ("Dr." -> "doctor" versus
"dr") gives the network token sequences it never saw, so the lists follow the reference
word for word, oddities included (Polish "m." reads "pan", Hungarian "b." reads "bácsi").
Keys are base language codes: the region is dropped ("zh-cn" -> "zh") before any lookup.
"""

from __future__ import annotations

__all__ = ["LANGUAGES", "CODES", "CHAR_LIMITS", "ABBREVIATIONS", "ABBREVIATION_NEEDS_DOT",
           "SYMBOLS", "SYMBOL_NAMES", "ORDINAL_SUFFIXES", "DOT_BEFORE_SPACE",
           "CURRENCY_SEPARATOR", "OWN_CHAR_LIMITS", "OWN_SYMBOL_NAMES"]

# The languages as XTTS-v2's config.json names them (and as the vocabulary's language
# tokens read: [en], [zh-cn], ...).
LANGUAGES = ("en", "es", "fr", "de", "it", "pt", "pl", "tr", "ru", "nl", "cs", "ar", "zh-cn",
             "hu", "ko", "ja", "hi")
CODES = frozenset(lang.split("-")[0] for lang in LANGUAGES)  # what a lookup uses

# Characters per piece of text beyond which the released model tends to cut the audio
# short (the reference warns past them and splits long text to fit them).
CHAR_LIMITS = {"en": 250, "de": 253, "fr": 273, "es": 239, "it": 213, "pt": 203, "pl": 224,
               "zh": 82, "ar": 166, "cs": 186, "ru": 182, "nl": 251, "tr": 226, "ja": 71,
               "hu": 224, "ko": 95, "hi": 150}

# (abbreviation, reading) in the order they are tried; the text is lower-cased first. An
# abbreviation matches at a word start and, except in Russian, takes its period with it.
ABBREVIATIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "en": (("mrs", "misess"), ("mr", "mister"), ("dr", "doctor"), ("st", "saint"),
           ("co", "company"), ("jr", "junior"), ("maj", "major"), ("gen", "general"),
           ("drs", "doctors"), ("rev", "reverend"), ("lt", "lieutenant"), ("hon", "honorable"),
           ("sgt", "sergeant"), ("capt", "captain"), ("esq", "esquire"), ("ltd", "limited"),
           ("col", "colonel"), ("ft", "fort")),
    "es": (("sra", "señora"), ("sr", "señor"), ("dr", "doctor"), ("dra", "doctora"),
           ("st", "santo"), ("co", "compañía"), ("jr", "junior"), ("ltd", "limitada")),
    "fr": (("mme", "madame"), ("mr", "monsieur"), ("dr", "docteur"), ("st", "saint"),
           ("co", "compagnie"), ("jr", "junior"), ("ltd", "limitée")),
    "de": (("fr", "frau"), ("dr", "doktor"), ("st", "sankt"), ("co", "firma"), ("jr", "junior")),
    "pt": (("sra", "senhora"), ("sr", "senhor"), ("dr", "doutor"), ("dra", "doutora"),
           ("st", "santo"), ("co", "companhia"), ("jr", "júnior"), ("ltd", "limitada")),
    "it": (("sig", "signore"), ("dr", "dottore"), ("st", "santo"), ("co", "compagnia"),
           ("jr", "junior"), ("ltd", "limitata")),
    "pl": (("p", "pani"), ("m", "pan"), ("dr", "doktor"), ("sw", "święty"), ("jr", "junior")),
    "cs": (("dr", "doktor"), ("ing", "inženýr"), ("p", "pan")),
    "ru": (("г-жа", "госпожа"), ("г-н", "господин"), ("д-р", "доктор")),
    "nl": (("dhr", "de heer"), ("mevr", "mevrouw"), ("dr", "dokter"), ("jhr", "jonkheer")),
    "tr": (("b", "bay"), ("byk", "büyük"), ("dr", "doktor")),
    "hu": (("dr", "doktor"), ("b", "bácsi"), ("nőv", "nővér")),
    "ar": (), "zh": (), "ko": (), "hi": (),
}
ABBREVIATION_NEEDS_DOT = frozenset(ABBREVIATIONS) - {"ru"}  # Russian ones end at a word end

# Each symbol is read as a word with spaces around it (whitespace is collapsed afterwards).
SYMBOLS = "&@%#$£°"
SYMBOL_NAMES: dict[str, tuple[str, ...]] = {  # in the order of SYMBOLS
    "en": ("and", "at", "percent", "hash", "dollar", "pound", "degree"),
    "es": ("y", "arroba", "por ciento", "numeral", "dolar", "libra", "grados"),
    "fr": ("et", "arobase", "pour cent", "dièse", "dollar", "livre", "degrés"),
    "de": ("und", "at", "prozent", "raute", "dollar", "pfund", "grad"),
    "pt": ("e", "arroba", "por cento", "cardinal", "dólar", "libra", "graus"),
    "it": ("e", "chiocciola", "per cento", "cancelletto", "dollaro", "sterlina", "gradi"),
    "pl": ("i", "małpa", "procent", "krzyżyk", "dolar", "funt", "stopnie"),
    "ar": ("و", "على", "في المئة", "رقم", "دولار", "جنيه", "درجة"),
    "zh": ("和", "在", "百分之", "号", "美元", "英镑", "度"),
    "cs": ("a", "na", "procento", "křížek", "dolar", "libra", "stupně"),
    "ru": ("и", "собака", "процентов", "номер", "доллар", "фунт", "градус"),
    "nl": ("en", "bij", "procent", "hekje", "dollar", "pond", "graden"),
    "tr": ("ve", "at", "yüzde", "diyez", "dolar", "sterlin", "derece"),
    "hu": ("és", "kukac", "százalék", "kettőskereszt", "dollár", "font", "fok"),
    "ko": ("그리고", "에", "퍼센트", "번호", "달러", "파운드", "도"),
    "hi": ("और", "ऐट दी रेट", "प्रतिशत", "हैश", "डॉलर", "पाउंड", "डिग्री"),
}

# What may follow the digits of an ordinal, tried in this order right after the digits (no
# space between). DOT_BEFORE_SPACE stands for a period followed by whitespace or the end of
# the text (German and Czech "am 1. Mai"); Turkish and Hungarian take a period wherever it
# is, so a sentence ending in a number reads it as an ordinal there, as in the reference.
# Chinese numbers go their own way (chinese.py).
DOT_BEFORE_SPACE = "<period before a space>"
ORDINAL_SUFFIXES: dict[str, tuple[str, ...]] = {
    "en": ("st", "nd", "rd", "th"),
    "es": ("º", "ª", "er", "o", "a", "os", "as"),
    "fr": ("º", "ª", "er", "re", "e", "ème"),
    "de": ("st", "nd", "rd", "th", "º", "ª", DOT_BEFORE_SPACE),
    "pt": ("º", "ª", "o", "a", "os", "as"),
    "it": ("º", "°", "ª", "o", "a", "i", "e"),
    "pl": ("º", "ª", "st", "nd", "rd", "th"),
    "ar": ("ون", "ين", "ث", "ر", "ى"),
    "cs": (DOT_BEFORE_SPACE,),
    "ru": ("-й", "-я", "-е", "-ое", "-ье", "-го"),
    "nl": ("de", "ste", "e"),
    "tr": (".", "inci", "nci", "uncu", "üncü"),
    "hu": (".", "adik", "edik", "odik", "ödik", "ödike", "ik"),
    "ko": ("번째", "번", "차", "째"),
    "hi": ("st", "nd", "rd", "th"),
}

# A whole currency amount is read without its zero cents: num2words' "twenty euro, zero
# cents" is cut at the last occurrence of this separator ("twenty euro").
CURRENCY_SEPARATOR = {"en": ", ", "es": " con ", "fr": " et ", "de": " und ", "pt": " e ",
                      "it": " e ", "pl": ", ", "cs": ", ", "ru": ", ", "nl": ", ", "ar": ", ",
                      "tr": ", ", "hu": ", ", "ko": ", ", "hi": ", "}


# -- languages beyond the released ones (myxtts.text.xtts_v2.grow adds them to a model)
#
# Not the reference's: these are cleaned by this project's own front end (text/cleaners.py)
# and spoken only by a model whose vocabulary was grown and which was then fine-tuned.
# Persian: 200 characters. A Persian letter is one token of a grown vocabulary (no merges
# were learnt for it), so 200 characters stay near 200 text tokens, half the GPT's 402; and
# Persian, like Arabic (166), leaves its short vowels unwritten, so a character carries more
# sound than in the Latin-script languages (203-273): 200 characters are about 15 s of
# speech, within the ~27 s the 605 audio codes hold. A first estimate, to be measured
# once a fine-tuned model speaks.
OWN_CHAR_LIMITS = {"fa": 200}
# Symbols read as words, as the reference does for its languages (in the order of SYMBOLS);
# a number's percent sign is read by the Persian number reader first.
OWN_SYMBOL_NAMES: dict[str, tuple[str, ...]] = {
    "fa": ("و", "ات", "درصد", "شماره", "دلار", "پوند", "درجه"),
}
