"""English -> German sentence pairs from a small grammar: the Transformer's CPU default corpus.

Real German, not a cipher: the translation has to learn a lexicon (about 150 words), noun
gender, nominative/accusative case on articles, possessives and adjective endings (weak, mixed
and strong declension), verb agreement, verb-second order after a fronted adverb, verb-final
order in subordinate clauses, and negation (`nicht` at the end of the clause, or `kein`).

  Today the big dog does not see my old cat because the children buy a red apple.
  Heute sieht der große Hund meine alte Katze nicht, weil die Kinder einen roten Apfel kaufen.

Sentences come from a seeded numpy generator, so the corpus is the same on every machine; the
train and eval sets use different seeds (random overlap of whole sentences is negligible and
is measured by the tests).
"""

from __future__ import annotations

import numpy as np

# english singular, english plural, german singular, german plural, gender (m/f/n)
NOUNS = [
    ("dog", "dogs", "Hund", "Hunde", "m"), ("cat", "cats", "Katze", "Katzen", "f"),
    ("house", "houses", "Haus", "Häuser", "n"), ("man", "men", "Mann", "Männer", "m"),
    ("woman", "women", "Frau", "Frauen", "f"), ("child", "children", "Kind", "Kinder", "n"),
    ("book", "books", "Buch", "Bücher", "n"), ("car", "cars", "Auto", "Autos", "n"),
    ("bird", "birds", "Vogel", "Vögel", "m"), ("apple", "apples", "Apfel", "Äpfel", "m"),
    ("flower", "flowers", "Blume", "Blumen", "f"), ("teacher", "teachers", "Lehrer", "Lehrer",
                                                   "m"),
    ("table", "tables", "Tisch", "Tische", "m"), ("door", "doors", "Tür", "Türen", "f"),
    ("window", "windows", "Fenster", "Fenster", "n"), ("horse", "horses", "Pferd", "Pferde", "n"),
    ("friend", "friends", "Freund", "Freunde", "m"), ("city", "cities", "Stadt", "Städte", "f"),
    ("letter", "letters", "Brief", "Briefe", "m"), ("tree", "trees", "Baum", "Bäume", "m"),
    ("girl", "girls", "Mädchen", "Mädchen", "n"), ("doctor", "doctors", "Arzt", "Ärzte", "m"),
    ("mother", "mothers", "Mutter", "Mütter", "f"), ("father", "fathers", "Vater", "Väter", "m"),
    ("bread", "breads", "Brot", "Brote", "n"), ("chair", "chairs", "Stuhl", "Stühle", "m"),
    ("picture", "pictures", "Bild", "Bilder", "n"), ("song", "songs", "Lied", "Lieder", "n"),
    ("bag", "bags", "Tasche", "Taschen", "f"), ("ship", "ships", "Schiff", "Schiffe", "n"),
    ("key", "keys", "Schlüssel", "Schlüssel", "m"), ("lamp", "lamps", "Lampe", "Lampen", "f"),
    ("garden", "gardens", "Garten", "Gärten", "m"), ("clock", "clocks", "Uhr", "Uhren", "f"),
    ("mouse", "mice", "Maus", "Mäuse", "f"), ("boat", "boats", "Boot", "Boote", "n"),
    ("cup", "cups", "Tasse", "Tassen", "f"), ("river", "rivers", "Fluss", "Flüsse", "m"),
    ("bicycle", "bicycles", "Fahrrad", "Fahrräder", "n"), ("shoe", "shoes", "Schuh", "Schuhe",
                                                          "m"),
]
# english, german stem (endings are added)
ADJECTIVES = [
    ("big", "groß"), ("small", "klein"), ("old", "alt"), ("new", "neu"), ("red", "rot"),
    ("green", "grün"), ("blue", "blau"), ("beautiful", "schön"), ("young", "jung"),
    ("fast", "schnell"), ("good", "gut"), ("hungry", "hungrig"), ("clever", "klug"),
    ("poor", "arm"), ("rich", "reich"), ("cold", "kalt"), ("warm", "warm"), ("loud", "laut"),
    ("funny", "lustig"), ("white", "weiß"), ("black", "schwarz"), ("yellow", "gelb"),
]
# english base, english 3rd singular, german 3rd singular, german 3rd plural (accusative object)
VERBS = [
    ("see", "sees", "sieht", "sehen"), ("buy", "buys", "kauft", "kaufen"),
    ("find", "finds", "findet", "finden"), ("like", "likes", "mag", "mögen"),
    ("carry", "carries", "trägt", "tragen"), ("paint", "paints", "malt", "malen"),
    ("visit", "visits", "besucht", "besuchen"), ("need", "needs", "braucht", "brauchen"),
    ("hold", "holds", "hält", "halten"), ("know", "knows", "kennt", "kennen"),
    ("hear", "hears", "hört", "hören"), ("love", "loves", "liebt", "lieben"),
    ("draw", "draws", "zeichnet", "zeichnen"), ("sell", "sells", "verkauft", "verkaufen"),
    ("wash", "washes", "wäscht", "waschen"), ("open", "opens", "öffnet", "öffnen"),
    ("look for", "looks for", "sucht", "suchen"), ("get", "gets", "bekommt", "bekommen"),
]
ADVERBS = [("today", "heute"), ("now", "jetzt"), ("here", "hier"), ("sometimes", "manchmal"),
           ("then", "dann"), ("in the morning", "morgens"), ("in the evening", "abends")]
CONJUNCTIONS = [("because", "weil"), ("when", "wenn"), ("although", "obwohl"),
                ("while", "während")]
POSSESSIVES = [("my", "mein"), ("your", "dein"), ("his", "sein"), ("her", "ihr"),
               ("our", "unser"), ("their", "ihr")]
NUMBERS = [("two", "zwei"), ("three", "drei"), ("four", "vier"), ("five", "fünf"),
           ("many", "viele")]
PRONOUNS = [("he", "er", False), ("she", "sie", False), ("they", "sie", True)]

_DEFINITE = {("nom", "m"): "der", ("nom", "f"): "die", ("nom", "n"): "das", ("nom", "p"): "die",
             ("acc", "m"): "den", ("acc", "f"): "die", ("acc", "n"): "das", ("acc", "p"): "die"}
_EIN_ENDING = {("nom", "m"): "", ("nom", "f"): "e", ("nom", "n"): "", ("nom", "p"): "e",
               ("acc", "m"): "en", ("acc", "f"): "e", ("acc", "n"): "", ("acc", "p"): "e"}
_WEAK = {("nom", "m"): "e", ("nom", "f"): "e", ("nom", "n"): "e", ("acc", "m"): "en",
         ("acc", "f"): "e", ("acc", "n"): "e"}             # plural: "en"
_MIXED = {("nom", "m"): "er", ("nom", "f"): "e", ("nom", "n"): "es", ("acc", "m"): "en",
          ("acc", "f"): "e", ("acc", "n"): "es"}           # plural (after kein/mein): "en"


def _article_en(word: str) -> str:
  return "an" if word[0] in "aeio" else "a"


def noun_phrase(rng: np.random.Generator, case: str, negate: bool = False
                ) -> tuple[str, str, bool, bool]:
  """(english, german, plural, negation absorbed) for a random noun phrase in `case`.

  With `negate`, an indefinite object takes German `kein` (absorbing the negation); a definite
  one leaves it to `nicht`.
  """
  en_sg, en_pl, de_sg, de_pl, gender = NOUNS[rng.integers(len(NOUNS))]
  plural = rng.random() < 0.35
  adjs = [ADJECTIVES[i] for i in rng.choice(len(ADJECTIVES), rng.choice(3, p=[0.45, 0.4, 0.15]),
                                            replace=False)]
  key = (case, "p" if plural else gender)
  kinds = ["the", "indef", "poss"] + (["number"] if plural and not negate else [])
  kind = kinds[rng.integers(len(kinds))]
  en_adj = " ".join(a for a, _ in adjs)
  noun_en, noun_de = (en_pl, de_pl) if plural else (en_sg, de_sg)
  absorbed = False
  if kind == "the":
    en_det, de_det = "the", _DEFINITE[key]
    ending = "en" if plural else _WEAK[key]
  elif kind == "poss":
    en_det, stem = POSSESSIVES[rng.integers(len(POSSESSIVES))]
    de_det = stem + _EIN_ENDING[key]
    ending = "en" if plural else _MIXED[key]
  elif kind == "number":
    en_det, de_det = NUMBERS[rng.integers(len(NUMBERS))]
    ending = "e"
  else:   # a / an / bare plural; kein when negated
    first = (en_adj or noun_en).split()[0]
    en_det = "" if plural else _article_en(first)
    if negate:
      de_det, absorbed = "kein" + _EIN_ENDING[key], True
      ending = "en" if plural else _MIXED[key]
    else:
      de_det = "" if plural else "ein" + _EIN_ENDING[key]
      ending = "e" if plural else _MIXED[key]
  de_adj = " ".join(g + ending for _, g in adjs)
  en = " ".join(w for w in (en_det, en_adj, noun_en) if w)
  de = " ".join(w for w in (de_det, de_adj, noun_de) if w)
  return en, de, plural, absorbed


def clause(rng: np.random.Generator, order: str) -> tuple[str, str]:
  """One subject-verb-object clause; order: 'main', 'inverted' (after an adverb) or 'sub'."""
  if rng.random() < 0.15:
    subj_en, subj_de, plural = PRONOUNS[rng.integers(len(PRONOUNS))]
  else:
    subj_en, subj_de, plural, _ = noun_phrase(rng, "nom")
  base, third, de3, de_pl = VERBS[rng.integers(len(VERBS))]
  negate = rng.random() < 0.25
  obj_en, obj_de, _, absorbed = noun_phrase(rng, "acc", negate)
  verb_de = de_pl if plural else de3
  if negate:
    verb_en = ("do not " if plural else "does not ") + base
  else:
    verb_en = base if plural else third
  nicht = ["nicht"] if negate and not absorbed else []
  en = f"{subj_en} {verb_en} {obj_en}"
  if order == "main":
    de = [subj_de, verb_de, obj_de] + nicht
  elif order == "inverted":
    de = [verb_de, subj_de, obj_de] + nicht
  else:
    de = [subj_de, obj_de] + nicht + [verb_de]
  return en, " ".join(de)


def _capitalize(s: str) -> str:
  return s[:1].upper() + s[1:]


def sentence(rng: np.random.Generator) -> tuple[str, str]:
  """One (english, german) sentence pair."""
  en, de = [], []
  if rng.random() < 0.3:
    adv_en, adv_de = ADVERBS[rng.integers(len(ADVERBS))]
    c_en, c_de = clause(rng, "inverted")
    en.append(f"{adv_en} {c_en}")
    de.append(f"{adv_de} {c_de}")
  else:
    c_en, c_de = clause(rng, "main")
    en.append(c_en)
    de.append(c_de)
  if rng.random() < 0.35:
    conj_en, conj_de = CONJUNCTIONS[rng.integers(len(CONJUNCTIONS))]
    s_en, s_de = clause(rng, "sub")
    en.append(f" {conj_en} {s_en}")
    de.append(f", {conj_de} {s_de}")
  return _capitalize("".join(en)) + ".", _capitalize("".join(de)) + "."


def corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
  """n sentence pairs: (english sentences, german sentences)."""
  rng = np.random.default_rng(seed)
  pairs = [sentence(rng) for _ in range(n)]
  return [p[0] for p in pairs], [p[1] for p in pairs]
