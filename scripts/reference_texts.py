"""Deterministic inputs for the llama.cpp reference fixtures.

Holds the strings the tokenizer fixture covers (hand-written cases per category plus
seeded combinations of them) and the prompts the logits fixture evaluates. Nothing here
depends on a model, so both models are checked against the same strings.
"""

import random

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world!",
    "hello world",
    "Hello World",
    "HELLO WORLD",
    "It's a truth universally acknowledged that a single man in possession of a good fortune must be in want of a wife.",
    "She said, \"I don't think so.\" Then she left.",
    "We'll see; they're late, aren't they? You've been warned, I'd say.",
    "Dr. Smith arrived at 10 a.m. on Jan. 5th, i.e. yesterday, e.g. before lunch.",
    "The U.S.A. and the U.K. signed the treaty in 1945.",
    "Tokenization splits text into subword units; byte-pair encoding merges frequent pairs.",
    "Once upon a time, in a land far, far away, there lived a curious little robot.",
    "What is the capital of France?",
    "The capital of France is Paris.",
    "Can you explain how a transformer model works, step by step?",
    "In 2023, the company reported revenue of $4.2 billion, up 12% year over year.",
    "Email me at someone@example.com or visit https://example.org/path?query=1&x=2#frag.",
    "The well-known state-of-the-art method isn't always the best one-size-fits-all solution.",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "supercalifragilisticexpialidocious",
    "a",
    "I",
    "A.",
    "ok",
    "Yes.",
    "No!",
    "Why?",
    "Mr. and Mrs. O'Brien's children's toys",
    "rock 'n' roll, ma'am, y'all, o'clock",
    "The cat sat on the mat. The dog sat on the log. The bird sat on the word.",
    "CamelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_CASE",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.",
    "To be, or not to be, that is the question.",
    "Four score and seven years ago our fathers brought forth on this continent a new nation.",
    "#hashtag @mention $TICKER %percent ^caret",
    "Version 2.0.1-beta+build.5 was released on 2024-03-15T12:34:56Z.",
    "The file is at C:\\Users\\Alice\\Documents\\report.docx or /home/alice/report.txt.",
    "Q: What's 2+2? A: 4.",
    "First line\nSecond line\nThird line",
    "Paragraph one.\n\nParagraph two.\n\n\nParagraph three.",
]

CODE = [
    "def add(a, b):\n    return a + b\n",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\nprint(x.shape)",
    "class Foo(object):\n\tdef __init__(self):\n\t\tself.x = 1\n",
    "for i in range(10):\n    if i % 2 == 0:\n        continue\n    print(f\"{i=}\")",
    "with open('data.txt', 'r', encoding='utf-8') as f:\n    lines = [l.strip() for l in f if l]\n",
    "lambda x: x ** 2 if x >= 0 else -x // 3",
    "@dataclass\nclass Point:\n    x: float = 0.0\n    y: float = 0.0\n",
    "fn main() {\n    println!(\"Hello, world!\");\n}\n",
    "pub fn parse<'a>(input: &'a str) -> Result<Vec<&'a str>, Box<dyn std::error::Error>> {\n    Ok(input.split(',').collect())\n}",
    "impl<T: Clone + Send + 'static> Iterator for Foo<T> {\n    type Item = T;\n    fn next(&mut self) -> Option<Self::Item> { None }\n}",
    "let v: Vec<u32> = (0..10).map(|x| x * x).filter(|&x| x % 3 == 0).collect();",
    "#[derive(Debug, Clone, PartialEq)]\nstruct S { a: i64, b: String }",
    "match x { Some(ref y) if *y > 0 => y, _ => &0 }",
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf(\"%d\\n\", argc);\n    return 0;\n}\n",
    "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "#define MAX(a, b) ((a) > (b) ? (a) : (b))",
    "struct node { struct node *next; void *data; };",
    "const add = (a, b) => a + b;\nconsole.log(add(1, 2));",
    "async function fetchData(url) {\n  const res = await fetch(url);\n  if (!res.ok) throw new Error(`HTTP ${res.status}`);\n  return res.json();\n}",
    "document.querySelectorAll('.item').forEach(el => el.classList.toggle('active'));",
    "let x = a ?? b; let y = obj?.prop?.[0]; x === y && x !== null || y >>>= 2;",
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Test &amp; Demo</title></head>\n<body><p class=\"x\">a &lt; b &gt; c</p></body>\n</html>",
    "<div id=\"main\"><a href=\"/x?a=1&b=2\">Link</a> &nbsp; &copy; 2024</div>",
    "<script>if (a < b && c > d) { alert('<&>'); }</script>",
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<root><item key='v'/></root>",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' ORDER BY id DESC LIMIT 10;",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done 2>&1 | tee log",
    "{\"name\": \"pml\", \"version\": \"0.1.0\", \"deps\": [1, 2.5, true, null], \"nested\": {\"k\": \"v\"}}",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "public static void main(String[] args) { System.out.println(\"Hello\"); }",
    "x = [1, 2, 3]; y = {k: v for k, v in zip('abc', x)}",
    "    indented_with_four_spaces()\n        eight_spaces()\n\t\ttwo_tabs()",
    "// comment\n/* block\n   comment */\n# hash comment\n-- sql comment",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f&=6;g|=7;h^=8;i<<=9;j>>=10;",
    "if (x != y && !z || (a <= b)) { return -1; }",
    "[package]\nname = \"pml-engine\"\nversion = \"0.1.0\"\nedition = \"2024\"\n",
    "fn f() -> impl Fn(i32) -> i32 { move |x| x + 1 }",
    "print('héllo wörld', \"日本語\", r'\\d+\\s*')",
    "    \n    \n",
    "```python\nprint(1)\n```",
]

UNICODE = [
    "café", "naïve", "résumé", "jalapeño", "Ångström", "Straße", "Œuvre", "façade",
    "Zürich über Köln", "ĳ ǅ ﬁ ﬂ",
    "日本語のテキストです。", "中文测试，你好世界！", "한국어 텍스트", "東京タワー", "漢字かなカナ",
    "Привет, мир!", "Γειά σου Κόσμε", "Ελληνικά και русский", "שלום עולם", "مرحبا بالعالم",
    "English then עברית then English", "العربية 123 English",
    "हिन्दी भाषा", "ภาษาไทย", "Tiếng Việt có dấu",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "❤️", "🎉 party 🎉", "I ❤ Unicode ☃ ★ ♠",
    "e\u0301", "a\u0308o\u0308u\u0308", "n\u0303", "Z\u0351\u0324a\u0308\u0317l\u0350g\u0302o\u0336",
    "zero\u200bwidth\u200bspace", "joiner\u200dhere", "non\u200cjoiner", "\ufeffBOM at start",
    "soft\u00adhyphen", "no\u00a0break\u00a0space", "thin\u2009space\u2003em\u3000ideographic",
    "left\u200eright\u200fmarks", "math: ∀x∈ℝ, ∃y≥0: x²+y²≤1 ⇒ √x ≈ π",
    "𝔸𝔹ℂ 𝕒𝕓𝕔", "𓀀𓀁 hieroglyphs", "𠀀𠀁 CJK extension B", "\ue000 private use",
    "«quotes» „German“ ‘single’ “double” …", "—em – en ‐ hyphen",
    "¡Hola! ¿Qué tal?", "½ ¼ ¾ ⅓ ™ © ® °C",
    "control\x01chars\x1b[0m\x7f", "bell\x07 and backspace\x08",
    "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３", "Ｈｅｌｌｏ！",
]

WHITESPACE = [
    " ", "  ", "   ", "    ", "        ", " " * 17, " " * 64,
    "\t", "\t\t", "\t\t\t\t", "\n", "\n\n", "\n\n\n", "\n" * 8,
    "\r\n", "\r\n\r\n", "\r", " \n", "\n ", " \t \n", "\t \t", "\n\t\n\t",
    " leading", "  two leading", "trailing ", "trailing  two", " both ", "   many   ",
    "word\tword", "word\t\tword", "word\nword", "word\n\nword", "word \n word",
    "a b  c   d    e     f", "x\u00a0y", "\n\n  indented after blank\n",
    "line with trailing spaces   \nnext", "\t\tdef f():\n\t\t\tpass", "end\n",
    " \n \n \n", "    \t    \t", "\x0b vertical tab \x0c form feed",
]

NUMBERS = [
    "0", "1", "12", "123", "1234", "12345", "123456789", "1234567890123456789",
    "3.14159", "2.718281828", "-42", "+7", "1e10", "6.022e23", "1.5E-9", "0x1F", "0b1010",
    "0o777", "1,000,000", "1.000.000,50", "1_000_000", "$19.99", "€5", "£3.50", "¥1000",
    "50%", "2024-01-01", "12:34:56", "192.168.0.1", "+1 (555) 123-4567", "3/4", "10^6",
    "v1.2.3", "x86_64", "utf8", "abc123def456", "٠١٢٣٤٥٦٧٨٩", "一二三四五", "①②③", "Ⅻ",
    "9999999999", "007",
]

PUNCTUATION = [
    "!", "?", ".", ",", "...", "!!!", "???", "?!", "!?!?", "---", "___", "***", "===",
    "~~~", "```", "'''", "\"\"\"", "()", "[]", "{}", "<>", "(((nested)))", "[[a]]", "{{b}}",
    "::", "->", "=>", "<=", ">=", "!=", "==", "&&", "||", "<<", ">>", "::<>", "#!/", "//",
    "/*", "*/", "<!--", "-->", "@@", "$$", "%%", "^^", "&&&", "|||", ";;", ":::",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "-_-", ":-)", ";)", "¯\\_(ツ)_/¯",
]

CONTROL_TEXT = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|repo_name|>x<|file_sep|>y",
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<s>", "</s>", "[INST] hi [/INST]", "<|endoftext|><|endoftext|>", "<|im_start",
    "|im_start|>", "<|IM_START|>", "text<|im_end|>text", " <bos> ", "<start_of_image>",
    "<|vision_start|><|image_pad|><|vision_end|>", "<tool_call>{}</tool_call>",
]

# Whole-document style cases: longer inputs stress merge order and pre-tokenizer splits.
LONG = [
    "a" * 300,
    "ab" * 150,
    " a" * 100,
    "1234567890" * 20,
    "😀" * 40,
    "日本" * 60,
    "-" * 120,
    "=" * 80 + "\n" + "#" * 80,
    " ".join(PROSE[:10]),
    "\n".join(CODE[:6]),
]

SEPARATORS = ["", " ", "  ", "\n", "\t", ", ", "\n\n", " \n", ". ", ""]


def _fragments():
    """Pieces the seeded generator recombines; short so combinations cross categories."""
    pieces = []
    for group in (PROSE, CODE, UNICODE, NUMBERS, PUNCTUATION, CONTROL_TEXT):
        for text in group:
            if 0 < len(text) <= 40:
                pieces.append(text)
    pieces.extend(["the", "The", " the", "ing", "tion", "un", "re", "'s", "'ll", "n't", "'RE", "'Ve"])
    return pieces


def _combinations(count, seed):
    rng = random.Random(seed)
    pieces = _fragments()
    out = []
    for _ in range(count):
        n_pieces = rng.randint(2, 5)
        text = ""
        for i in range(n_pieces):
            if i:
                text += rng.choice(SEPARATORS)
            text += rng.choice(pieces)
        if rng.random() < 0.2:
            text = rng.choice([" ", "\n", "\t", "  "]) + text
        if rng.random() < 0.2:
            text += rng.choice([" ", "\n", "\t", "  "])
        out.append(text)
    return out


def tokenizer_cases():
    """All tokenizer strings, in a fixed order, duplicates removed (first one kept)."""
    texts = [""]
    for group in (PROSE, CODE, UNICODE, WHITESPACE, NUMBERS, PUNCTUATION, CONTROL_TEXT, LONG):
        texts.extend(group)
    texts.extend(_combinations(120, seed=20240611))
    seen = set()
    unique = []
    for text in texts:
        if text not in seen:
            seen.add(text)
            unique.append(text)
    return unique


PARAGRAPH = (
    "The history of computing is a story of abstraction layered upon abstraction. Early machines "
    "were programmed by rewiring panels and flipping switches, and every program was tied to the "
    "physical layout of a particular device. The stored-program concept changed this: instructions "
    "became data, held in the same memory as the numbers they manipulated, and a single machine "
    "could run any program that fit. Assemblers then gave names to instructions and addresses, "
    "compilers translated expressions and loops into those instructions, and operating systems hid "
    "the details of disks, terminals and memory behind files and processes. Each layer let people "
    "think about a larger problem while trusting the layer beneath to handle the smaller ones. "
    "Today a programmer can write a few lines that train a neural network on thousands of "
    "processors without knowing how any one of them adds two numbers. The cost of this tower is "
    "that failures at the bottom can surface in surprising ways at the top, so good engineers "
    "still learn how the lower layers work, even if they rarely touch them directly."
)

CODE_PROMPT = (
    "def quicksort(items):\n"
    "    if len(items) <= 1:\n"
    "        return items\n"
    "    pivot = items[len(items) // 2]\n"
    "    left = [x for x in items if x < pivot]\n"
    "    middle = [x for x in items if x == pivot]\n"
    "    right = [x for x in items if x > pivot]\n"
    "    return quicksort(left) + middle + quicksort(right)\n"
    "\n"
    "print(quicksort([3, 6, 8, 10, 1, 2, 1]))\n"
)

QUESTION = "What is the capital of France?"

CHAT_PROMPTS = {
    "qwen2.5-0.5b": (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    ),
    # Gemma's template starts with <bos>; llama.cpp adds it itself (add_bos_token), so it is left out here.
    "gemma3-270m": f"<start_of_turn>user\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n",
    # SmolLM2's ChatML with the default system prompt of its template.
    "smollm2-135m": (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    ),
}


def logits_prompts(model_id):
    """(name, text, parse_special) for the logits fixture; only chat markup is parsed as special."""
    return [
        ("chat_capital_of_france", CHAT_PROMPTS[model_id], True),
        ("code_quicksort", CODE_PROMPT, False),
        ("prose_short", "The quick brown fox jumps over the lazy dog. Then it ran into the forest and", False),
        ("paragraph_long", PARAGRAPH, False),
        ("unicode_mixed", "Café au lait, 日本語, emoji 😀 and numbers 3.14159 — all in one line.\n\tDone.", False),
    ]
