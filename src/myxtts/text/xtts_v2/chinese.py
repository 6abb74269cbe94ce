"""Chinese for XTTS-v2: Arabic numerals read as Chinese numerals, punctuation folded into
commas (``normalize_chinese``), then Hanzi as tone-numbered pinyin (``to_pinyin``).

The reference (coqui-tts 0.28, its zh_num2words ``TextNorm()`` with default options) reads
numbers in passes over the text, each finding its pattern and replacing the FIRST
occurrence of each found string (not necessarily where it was found): dates, money,
mobile then fixed-line phone numbers, fractions, percentages, a number before a measure
word, runs of 4 to 32 digits (read digit by digit, like a serial number: "2024" without a
measure word becomes "二零二四"), then every remaining number; "P2P" keeps its 2. Every
punctuation mark, Chinese or ASCII, then becomes a comma. This module reproduces those
passes and their order; the model was trained on their output.
"""

from __future__ import annotations

import re
import string

__all__ = ["normalize_chinese", "read_number", "to_pinyin", "PUNCTUATION"]

_DIGITS = "零一二三四五六七八九"
# (power of ten, character): 十 百 千 万, then 亿 10^8 and each next one 10^4 larger.
_UNITS = tuple([(1, "十"), (2, "百"), (3, "千"), (4, "万")]
               + [(8 + 4 * i, c) for i, c in enumerate("亿兆京垓秭穰沟涧正载")])

# Punctuation that becomes a comma: full-width and CJK marks (the Zhon project's lists),
# then ASCII's.
PUNCTUATION = ("！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃《》「」"
               "『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏·〈〉-" + string.punctuation)
_TO_COMMA = str.maketrans(PUNCTUATION, "," * len(PUNCTUATION))

# Measure words that make a number a quantity ("3个", "5公斤" is not one: 公 is not here).
_MEASURE_CHARS = ("匹张座回场尾条个首阙阵网炮顶丘棵只支袭辆挑担颗壳窠曲墙群腔砣客贯扎捆刀令打手"
                  "罗坡山岭江溪钟队单双对出口头脚板跳枝件贴针线管名位身堂课本页家户层丝毫厘分钱"
                  "两斤铢石钧锱忽寸尺丈里寻常铺程撮勺合升斗盘碗碟叠桶笼盆盒杯斛锅簋篮罐瓶壶卮盏"
                  "箩箱煲啖袋钵年月日季刻时周天秒旬纪岁世更夜春夏秋冬代伏辈丸泡粒幢堆根道面片块")
_MEASURE = f"(?:[{_MEASURE_CHARS}]|[千毫微]克|[千分厘毫微]米)"
_SCALE = "(?:亿|千万|百万|万|千|百)"
_MONEY_UNIT = f"(?:{_SCALE}|(?:{_SCALE}|)元|(?:{_SCALE}|)块|角|毛|分)"
_NUMBER = r"\d+(?:\.\d+)?"

_DATE = re.compile(r"\D+((?:(?:[089]\d|(?:19|20)\d{2})年)?(?:\d{1,2}月(?:\d{1,2}[日号])?)?)")
_MONEY = re.compile(rf"\D+({_NUMBER}[多余几]?{_MONEY_UNIT}(?:\d{_MONEY_UNIT}?)?)")
_MOBILE = re.compile(r"\D((?:\+?86 ?)?1(?:[38]\d|5[0-35-9]|7[678]|9[89])\d{8})\D")
_LANDLINE = re.compile(r"\D((?:0(?:10|2[1-3]|[3-9]\d{2})-?)?[1-9]\d{6,7})\D")
_FRACTION = re.compile(r"(\d+/\d+)")
_PERCENT = re.compile(rf"({_NUMBER}%)")
_QUANTITY = re.compile(rf"({_NUMBER})[多余几]?{_MEASURE}")
_SERIAL = re.compile(r"(\d{4,32})")
_CARDINAL = re.compile(rf"({_NUMBER})")
_LATIN_2_LATIN = re.compile(r"([a-zA-Z]+)二([a-zA-Z]+)")
_ANY_NUMBER = re.compile(_NUMBER)


def _grouped(digits: str) -> list[tuple[str, int]]:
    """An integer's symbols read with units: ("d", digit) and ("u", power). The largest unit
    below the number's length splits it, each side read the same way; a zero run before a
    last lone digit reads as one 零 ("105" -> 一百零五)."""
    body = digits.lstrip("0")
    if not body:
        return []
    if len(body) == 1:
        return ([("d", 0)] if len(body) != len(digits) else []) + [("d", int(body))]
    power = next(p for p, _ in reversed(_UNITS) if p < len(body))
    return _grouped(digits[:-power]) + [("u", power)] + _grouped(body[-power:])


def read_number(number: str, units: bool = True) -> str:
    """``number`` ("1205", "3.14", "05") in Chinese numerals; ``units=False`` reads digit by
    digit (years, phone numbers, serials). With units, a 2 before 百/千/万/... that follows no
    十 is 两 ("200" -> 两百), and a leading 一十 is 十 ("12" -> 十二)."""
    whole, _, fraction = number.partition(".")
    symbols = (_grouped(whole) if units and len(whole) > 1
               else [("d", int(c)) for c in whole])
    if fraction:
        symbols += [("p", 0)] + [("d", int(c)) for c in fraction]
    unit_names = dict(_UNITS)
    out = []
    for i, (kind, value) in enumerate(symbols):
        if kind == "u":
            out.append(unit_names[value])
        elif kind == "p":
            out.append("点")
        elif value == 2 and units and _reads_liang(symbols, i):
            out.append("两")
        else:
            out.append(_DIGITS[value])
    text = "".join(out)
    if text.startswith("点"):
        return "零" + text
    if text[:2] == "一十":
        text = text[1:]
    return text


def _reads_liang(symbols: list[tuple[str, int]], i: int) -> bool:
    """Whether the 2 at ``i`` reads 两: a unit other than 十 follows, and before it is
    nothing or a unit other than 十."""
    after = symbols[i + 1] if i + 1 < len(symbols) else ("", 0)
    before = symbols[i - 1] if i > 0 else None
    return (after[0] == "u" and after[1] != 1
            and (before is None or (before[0] == "u" and before[1] != 1)))


def _date(date: str) -> str:
    """"2024年5月1日" -> 二零二四年五月一日: the year digit by digit, month and day as numbers.
    The pattern guarantees a 月 whenever anything follows the year."""
    year, has_year, rest = date.partition("年")
    out = read_number(year, units=False) + "年" if has_year else ""
    if not has_year:
        rest = date
    if rest:
        month, _, day = rest.partition("月")
        out += read_number(month) + "月"
        if day:
            out += read_number(day[:-1]) + day[-1]
    return out


def _money(money: str) -> str:
    """Every number inside ``money`` ("15元5角") read out, each found string replaced
    everywhere it occurs."""
    for number in _ANY_NUMBER.findall(money):
        money = money.replace(number, read_number(number))
    return money


def _phone(phone: str, separator: str | None) -> str:
    """Digit by digit; the separators (spaces of a mobile number, the dash of a landline)
    dropped."""
    parts = phone.strip("+").split(separator)
    return "".join(read_number(part, units=False) for part in parts)


def _fraction(fraction: str) -> str:
    numerator, denominator = fraction.split("/")
    return read_number(denominator) + "分之" + read_number(numerator)


def _each_first(pattern: re.Pattern[str], text: str, read) -> str:
    """For each string ``pattern`` finds in ``text`` (its first group), replace the first
    occurrence of that string in the text as it now stands by ``read(string)``."""
    for found in pattern.findall(text):
        if found:
            text = text.replace(found, read(found), 1)
    return text


def normalize_chinese(text: str) -> str:
    """Lower-cased Chinese ``text`` with its numbers in Chinese numerals and every
    punctuation mark a comma (the reference's ``TextNorm()(text)``)."""
    text = "^" + text + "$"  # the passes' \D needs a character on either side
    text = _each_first(_DATE, text, _date)
    text = _each_first(_MONEY, text, _money)
    text = _each_first(_MOBILE, text, lambda s: _phone(s, None))
    text = _each_first(_LANDLINE, text, lambda s: _phone(s, "-"))
    text = _each_first(_FRACTION, text, _fraction)
    text = text.replace("％", "%")
    text = _each_first(_PERCENT, text, lambda s: "百分之" + read_number(s.strip().strip("%")))
    text = _each_first(_QUANTITY, text, read_number)
    text = _each_first(_SERIAL, text, lambda s: read_number(s, units=False))
    text = _each_first(_CARDINAL, text, read_number)
    for m in _LATIN_2_LATIN.finditer(text):  # "p2p" was read "p二p": give its 2 back
        text = text.replace(m.group(0), m.group(1) + "2" + m.group(2), 1)
    return text.lstrip("^").rstrip("$").translate(_TO_COMMA)


def to_pinyin(text: str) -> str:
    """Hanzi as pinyin with tone numbers (neutral tone 5), syllables run together
    ("你好" -> "ni3hao3"); other characters pass through."""
    try:
        import pypinyin  # optional: Chinese only
    except ImportError:
        raise ImportError("Chinese text needs pypinyin: pip install pypinyin "
                          "(or pip install 'myxtts[xtts]')") from None
    syllables = pypinyin.pinyin(text, style=pypinyin.Style.TONE3, heteronym=False,
                                neutral_tone_with_five=True)
    return "".join(s[0] for s in syllables)
