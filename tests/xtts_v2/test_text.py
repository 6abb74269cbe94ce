"""XTTS-v2's text front end (myxtts.text.xtts_v2) against the oracle, coqui-tts 0.28's
``VoiceBpeTokenizer``: the same cleaned text and the same ids for every language, on a
BPE vocabulary in XTTS's format (reference.make_vocab); plus fixed expectations that hold
without the oracle, the errors, and the splitting of long text."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from myxtts.text import TokenizerError
from myxtts.text.xtts_v2 import CHAR_LIMITS, LANGUAGES, XttsTokenizer, normalize
from myxtts.text.xtts_v2.chinese import PUNCTUATION, normalize_chinese, read_number, to_pinyin
from tests.xtts_v2.reference import make_vocab

# Per language: numbers (integers, decimals, ordinals, currency, thousands separators),
# abbreviations, symbols, mixed case, quotes.
SENTENCES = {
    "en": ["Dr. Smith paid $20.15 for 3 apples & 2 pears on the 1st of May.",
           "Mr. and Mrs. Jones own 1,234,567 shares; that's 12.5% of Jones Co. Ltd.",
           "It costs £3, or 20€ @ the 2nd shop in St. Louis, #42 at 36.6°!",
           'She said "HELLO" to Capt. Hook at 10:30 on the 23rd, 21st and 4th.'],
    "es": ["El Sr. García pagó $20,15 por 3 manzanas & 2 peras el 1º de mayo.",
           "La Dra. López tiene 1.234.567 acciones, el 12,5% de la empresa.",
           "Cuesta 20€ o £3 en la 2ª tienda, #7 a 36,6°. ¡HOLA Sra. Ruiz!"],
    "fr": ["Mme. Dupont a payé 20,15€ pour 3 pommes & 2 poires le 1er mai.",
           "Le Dr. Martin a 1.234.567 actions, soit 12,5% du total, #3.",
           "Ça coûte $20 ou £3 au 2e magasin @ Paris, 36,6° dehors."],
    "de": ["Frau Dr. Müller zahlte 20,15€ für 3 Äpfel & 2 Birnen am 1. Mai.",
           "St. Pauli hat 1.234.567 Fans, also 12,5% mehr als Co. Schmidt.",
           "Das kostet $20 oder £3 im 2nd Laden @ Berlin, #5 bei 36,6°."],
    "it": ["Il Sig. Rossi ha pagato 20,15€ per 3 mele & 2 pere il 1º maggio.",
           "Il Dr. Bianchi ha 1.234.567 azioni, il 12,5% del totale.",
           "Costa $20 o £3 nel 2° negozio @ Roma, #9 a 36,6 gradi."],
    "pt": ["O Sr. Silva pagou 20,15€ por 3 maçãs & 2 peras no 1º dia.",
           "A Dra. Costa tem 1.234.567 ações, 12,5% do total.",
           "Custa $20 ou £3 na 2ª loja @ Lisboa, #4 a 36,6°."],
    "pl": ["P. Kowalski zapłacił 20,15€ za 3 jabłka & 2 gruszki.",
           "Dr. Nowak ma 1.234.567 akcji, czyli 12,5% całości.",
           "To kosztuje $20 albo 5€ w 2nd sklepie @ Warszawa, #3 przy 36,6°."],
    "tr": ["Dr. Yılmaz 1. sırada 20€ ödedi & 3 elma aldı.",
           "İSTANBUL'da 1.234.567 kişi yaşıyor, %12 ÖĞRENCİ, Üsküdar.",
           "B. Demir $20 ile 3üncü mağazaya gitti @ Ankara, #5 36,6°."],
    "ru": ["Г-н Иванов заплатил 20.15€ за 3 яблока & 2 груши.",
           "Д-р Петров владеет 1,234,567 акциями, это 12.5% всего.",
           "Это стоит $20 в 2-й магазин @ Москва, #3 при 36,6°."],
    "nl": ["Dhr. Jansen betaalde 20,15€ voor 3 appels & 2 peren op de 1ste.",
           "Mevr. de Vries heeft 1.234.567 aandelen, 12,5% van alles.",
           "Het kost $20 of £3 in de 2de winkel @ Amsterdam, #4 bij 36,6°."],
    "cs": ["Dr. Novák zaplatil 20,15€ za 3 jablka & 2 hrušky.",
           "P. Svoboda má 1.234.567 akcií, tedy 12,5% celku.",
           "Stojí to 20€ v obchodě @ Praha, #3 při 36,6°."],
    "ar": ["دفع الدكتور 20 دولارا مقابل 3 تفاحات & 2 كمثرى.",
           "لديه 1.234.567 سهما، أي 12,5% من المجموع.",
           "يكلف $20 أو £3 في المتجر @ القاهرة، #5 عند 36,6°."],
    "zh": ["今天是2024年5月1日，我买了3个苹果和2斤梨，花了15元5角。",
           "他有50%的把握，电话是13812345678，座机010-12345678。",
           "这个P2P平台有1234567个用户，增长了12.5%，约3/4的人满意！",
           "温度是36.6°，价格£3 & 更多。"],
    "hu": ["Dr. Szabó 20,15€-t fizetett 3 almáért & 2 körtéért az 1. napon.",
           "B. Kovács 1.234.567 részvénnyel bír, ez 12,5% az egészből.",
           "Ez $20 vagy £3 a 2. boltban @ Budapest, #3 36,6°-nál."],
    "ko": ["배터리 잔량이 14%입니다. 12.5 초 안에 3번째 문제를 풀었다.",
           "가격은 $20 & 1,234원이고, 2차 회의는 @ 서울에서 합니다.",
           "안녕하세요 KOREA 50 명의 병사가 있었다 #1."],
    "ja": ["今日は2024年5月1日です。「テスト」を3回しました！",
           "東京タワーの高さは333メートル、価格は1,200円です。",
           "こんにちは、世界。私はJohnです。"],
    "hi": ["नमस्ते दुनिया! यह एक परीक्षण है & @ # सब ठीक है।",
           "मेरे पास प्रतिशत % बैटरी है और $ £ ° भी।",
           "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।"],
}
# The reference's oddities, which the released model learnt: a period-grouped amount in
# English is a decimal, any character groups thousands outside English and Russian (only
# periods go), an unreadable amount ends the currency pass for the currencies after it,
# Turkish has no decimals, Arabic-Indic digits are grouped but not read.
QUIRKS = [
    ("en", "Between 1.000.000 and $1.000.000 and £2 and 3€ there is 1 234; the 5th-6th."),
    ("en", "£1,000.50 or $1,000,000 or 1,000.5 or 12,34,567"),
    ("es", "Pagó $1,000 y 1 234,5 € o 1x234 o 1.5.2024"),
    ("pl", "£5 i $3 i 4€"),
    ("tr", "$5 ve 3,5 € ve 1.234 ve 7."),
    ("ar", "لديه ١٢٣ سهما و٣٬٥ و 4th"),
    ("hu", "£5, $3, 4€ és 3.-án"),
    ("it", "14° e 2a e 3e"),
]
_OPTIONAL = {"zh": "pypinyin", "ja": "cutlet", "ko": "ko_speech_tools"}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return make_vocab(tmp_path_factory.mktemp("xtts_text") / "vocab.json")


@pytest.fixture(scope="module")
def ours(vocab):
    return XttsTokenizer(vocab)


@pytest.fixture(scope="module")
def oracle(vocab):
    tok = pytest.importorskip("TTS.tts.layers.xtts.tokenizer", reason="coqui-tts is the oracle",
                              exc_type=ImportError)
    logging.getLogger(tok.__name__).setLevel(logging.ERROR)  # its over-the-limit warnings
    return tok.VoiceBpeTokenizer(vocab_file=str(vocab))


def test_every_language_has_sentences():
    assert {"zh" if lang == "zh-cn" else lang for lang in LANGUAGES} == set(SENTENCES)


@pytest.mark.parametrize("lang", sorted(SENTENCES))
def test_text_and_ids_equal_the_reference(lang, ours, oracle):
    if lang in _OPTIONAL:
        pytest.importorskip(_OPTIONAL[lang])
    for text in SENTENCES[lang]:
        assert ours.normalize(text, lang) == oracle.preprocess_text(text, lang), text
        assert ours.encode(text, lang) == oracle.encode(text, lang), text
    ids = ours.encode(SENTENCES[lang][0], lang)
    assert ours.decode(ids) == oracle.decode(ids)


@pytest.mark.parametrize("lang, text", QUIRKS)
def test_the_references_quirks_are_kept(lang, text, ours, oracle):
    assert ours.normalize(text, lang) == oracle.preprocess_text(text, lang)
    assert ours.encode(text, lang) == oracle.encode(text, lang)


def test_ids_start_with_the_language_token_and_spell_spaces(ours, vocab):
    table = json.loads(vocab.read_text(encoding="utf-8"))["model"]["vocab"]
    ids = ours.encode("Hello world", "en")
    assert ids[0] == table["[en]"] and ids.count(table["[SPACE]"]) == 1
    assert ours.decode(ids) == "[en]hello world"


def test_zh_and_zh_cn_are_the_same_language(ours, vocab):
    pytest.importorskip("pypinyin")
    table = json.loads(vocab.read_text(encoding="utf-8"))["model"]["vocab"]
    ids = ours.encode("你好，世界。", "zh-cn")
    assert ids == ours.encode("你好，世界。", "zh") and ids[0] == table["[zh-cn]"]


def test_vocabulary_facts_equal_the_reference(ours, oracle, vocab):
    table = json.loads(vocab.read_text(encoding="utf-8"))["model"]["vocab"]
    assert ours.n_tokens == oracle.get_number_tokens() == max(table.values()) + 1
    assert (ours.start_token, ours.stop_token) == (table["[START]"], table["[STOP]"])
    assert ours.char_limits == oracle.char_limits == CHAR_LIMITS
    assert ours.char_limit("zh-cn") == 82 and ours.char_limit("en") == 250


# -- fixed expectations (hold without the oracle; a wrong table or order breaks them)

FIXED = [
    ("en", "Dr. Smith paid $20.15 for 3 apples & 2 pears on the 1st.",
     "doctor smith paid twenty dollars, fifteen cents for three apples and two pears on the first."),
    ("en", "Mrs. Jones owns 1,234 shares (12.5%) of #1 Co. Ltd. @ £3",
     "misess jones owns one thousand, two hundred and thirty-four shares (twelve point five "
     "percent ) of hash one company limited at three pounds sterling"),
    ("en", 'He said "HI" at 20€.', "he said hi at twenty euro."),
    ("es", "El Sr. García pagó 20,15€ por 3 manzanas & el 1º premio.",
     "el señor garcía pagó veinte euros con quince céntimos por tres manzanas y el primero premio."),
    ("es", "La Dra. López tiene 1.234 libros, un 12,5% @ casa.",
     "la doctora lópez tiene mil doscientos treinta y cuatro libros, un doce punto cinco por "
     "ciento arroba casa."),
    ("tr", "İSTANBUL ÖZ ÜMİT 1. sırada", "istanbul öz ümit birinci sırada"),
    ("de", "Am 1. Mai zahlte Dr. Müller 12,5 Euro.",  # num2words' capital survives
     "am erste mai zahlte doktor müller zwölf Komma fünf euro."),
    ("ru", "Д-р Петров: 12.5% и 1,000 руб.",
     "доктор петров: двенадцать целых пять десятых процентов и одна тысяча руб."),
]


@pytest.mark.parametrize("lang, text, expected", FIXED)
def test_fixed_normalisations(lang, text, expected):
    assert normalize(text, lang) == expected


def test_the_fixed_expectations_are_the_references(oracle):
    assert [oracle.preprocess_text(text, lang) for lang, text, _ in FIXED] == [
        expected for _, _, expected in FIXED]


def test_where_num2words_cannot_read_a_number_it_is_kept_rather_than_raised():
    # The reference raises NotImplementedError here (num2words has no Hindi, no Czech ordinals).
    assert normalize("मेरे पास 14% बैटरी", "hi") == "मेरे पास 14 प्रतिशत बैटरी"
    assert normalize("Dne 5. května", "cs") == "dne pět. května"


@pytest.mark.parametrize("number, expected", [
    ("0", "零"), ("7", "七"), ("10", "十"), ("12", "十二"), ("20", "二十"), ("105", "一百零五"),
    ("200", "两百"), ("2200", "两千两百"), ("1005", "一千零五"), ("100000", "十万"),
    ("120000000", "一亿两千万"), ("3.14", "三点一四"), ("0.5", "零点五"), ("05", "零五"),
])
def test_chinese_numerals(number, expected):
    assert read_number(number) == expected


def test_chinese_numbers_in_text():
    assert normalize_chinese("2024年5月1日") == "二零二四年五月一日"
    assert normalize_chinese("我有3个苹果和50%的把握") == "我有三个苹果和百分之五十的把握"
    assert normalize_chinese("花了15元5角，约3/4。") == "花了十五元五角,约四分之三,"
    assert normalize_chinese("编号2024，电话13812345678") == "编号二零二四,电话一三八一二三四五六七八"
    assert normalize_chinese("p2p和b2b") == "p2p和b2b"


def test_chinese_measure_words_and_punctuation_equal_the_reference():
    zh = pytest.importorskip("TTS.tts.layers.xtts.zh_num2words", reason="coqui-tts is the oracle",
                              exc_type=ImportError)
    norm = zh.TextNorm()
    measures = zh.COM_QUANTIFIERS.strip("()").replace("(", "").replace(")", "").split("|")
    for word in [*measures, "千克", "微米", "公斤", "人"]:
        for number in ("3", "12", "2000", "1.5"):
            text = f"有{number}{word}"
            assert normalize_chinese(text) == norm(text), text
    assert set(PUNCTUATION) == set(zh.PUNCS)
    text = "".join(zh.PUNCS) + "好"
    assert normalize_chinese(text) == norm(text)


def test_pinyin_has_tone_numbers_and_neutral_five():
    pytest.importorskip("pypinyin")
    assert to_pinyin("你好吗") == "ni3hao3ma5"


# -- errors

def test_unsupported_language_is_one_line_naming_the_languages(ours):
    with pytest.raises(TokenizerError) as err:
        ours.encode("hello", "xx")
    message = str(err.value)
    assert "\n" not in message and "'xx'" in message and "zh-cn" in message and "hi" in message
    with pytest.raises(TokenizerError):
        normalize("hello", "EN")


def test_missing_and_garbled_vocabulary_name_the_file(tmp_path):
    missing = tmp_path / "nowhere" / "vocab.json"
    with pytest.raises(TokenizerError, match="vocab.json: vocabulary file not found") as err:
        XttsTokenizer(missing)
    assert "\n" not in str(err.value)
    garbled = tmp_path / "vocab.json"
    garbled.write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="vocab.json: not a tokenizers vocabulary") as err:
        XttsTokenizer(garbled)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("token", ["[START]", "[STOP]"])
def test_vocabulary_without_start_or_stop_names_file_and_token(tmp_path, vocab, token):
    data = json.loads(vocab.read_text(encoding="utf-8"))
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != token]
    del data["model"]["vocab"][token]
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(TokenizerError) as err:
        XttsTokenizer(path)
    assert str(path) in str(err.value) and token in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("module, lang, package", [("pypinyin", "zh", "pypinyin"),
                                                   ("cutlet", "ja", "cutlet"),
                                                   ("ko_speech_tools", "ko", "ko-speech-tools"),
                                                   ("num2words", "en", "num2words")])
def test_a_missing_language_package_is_one_line_naming_it(monkeypatch, module, lang, package):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(ImportError, match=f"pip install {package}") as err:
        normalize("1", lang)
    assert "\n" not in str(err.value)


# -- splitting long text

_LONG = {
    "en": ("The quick brown fox jumps over the lazy dog. " * 4 + "Dr. Smith, who lives at "
           "42 Baker Street, said that the weather, which had been terrible for weeks, "
           "would improve soon, although nobody believed him at all, not even his wife; "
           "she laughed. " + "Supercalifragilisticexpialidocious" * 9 + " is long. " * 3),
    "zh": "今天天气很好，我们去公园散步。" * 8 + "这是一个非常非常长的句子" * 12 + "。好！",
    "ja": "今日は良い天気です。" * 10 + "とても長い文章" * 15,
    "hi": "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। " * 8,
    "ko": "안녕하세요. 반갑습니다! " * 12,
}


@pytest.mark.parametrize("lang", sorted(_LONG))
def test_split_respects_the_limit_and_loses_nothing(ours, lang):
    text, limit = _LONG[lang], ours.char_limit(lang)
    pieces = ours.split(text, lang)
    assert len(pieces) > 1 and all(pieces)
    too_long = [p for p in pieces if len(p) > limit]
    assert all(" " not in p for p in too_long), too_long  # only a single over-long word
    if lang in ("zh", "ja"):
        assert "".join("".join(pieces).split()) == "".join(text.split())
    else:
        assert " ".join(pieces) == " ".join(text.split())
    if lang == "en":
        assert too_long == ["Supercalifragilisticexpialidocious" * 9]
    else:
        assert not too_long


def test_split_keeps_sentences_whole_and_short_text_as_one(ours):
    text = "First sentence here. Second one! Third?"
    assert ours.split(text, "en") == [text]
    sentence = "word " * 40 + "end."
    pieces = ours.split(" ".join([sentence.strip()] * 3), "en")
    assert pieces == [sentence.strip()] * 3  # each fits alone, two together do not
