"""The 20 JSON Schemas of tests/test_structured.py and bench/structured_cost.py: nested objects,
arrays with min/max items, enums, numbers with ranges, optional fields, strings with patterns.
Each comes with the request a user would send with it. Free strings carry a maxLength, arrays a
maxItems and numbers a multipleOf, as a schema for a small model should: the constraint
guarantees the shape, the bounds that the output ends within max_tokens (a bare "number" lets a
135M model write zeros after the decimal point until max_tokens)."""

NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SHORT = {"type": "string", "maxLength": 16}

SCHEMAS = [
    ("a person's name and age",
     {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
      "required": ["name", "age"], "additionalProperties": False}),
    ("a yes/no answer: is the sky blue?",
     {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"],
      "additionalProperties": False}),
    ("the sentiment of 'I love this phone'",
     {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}},
      "required": ["sentiment"], "additionalProperties": False}),
    ("a product with a price between 0 and 1000",
     {"type": "object", "properties": {"product": NAME, "price": {"type": "number", "minimum": 0, "maximum": 1000,
                                                                                   "multipleOf": 0.01}},
      "required": ["product", "price"], "additionalProperties": False}),
    ("three colors",
     {"type": "object", "properties": {"colors": {"type": "array", "items": SHORT, "minItems": 3, "maxItems": 3}},
      "required": ["colors"], "additionalProperties": False}),
    ("a US zip code",
     {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"],
      "additionalProperties": False}),
    ("a person with an address (street, city, zip)",
     {"type": "object", "properties": {
         "name": NAME,
         "address": {"type": "object", "properties": {
             "street": NAME, "city": SHORT, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
             "required": ["street", "city", "zip"], "additionalProperties": False}},
      "required": ["name", "address"], "additionalProperties": False}),
    ("a date in ISO format",
     {"type": "object", "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
      "required": ["date"], "additionalProperties": False}),
    ("a list of 1 to 4 integers between 1 and 99",
     {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 99}, "minItems": 1, "maxItems": 4}),
    ("a book: title, optional subtitle, year",
     {"type": "object", "properties": {"title": NAME, "subtitle": NAME,
                                       "year": {"type": "integer", "minimum": 1400, "maximum": 2030}},
      "required": ["title", "year"], "additionalProperties": False}),
    ("a 2D point",
     {"type": "object", "properties": {"x": {"type": "number", "minimum": -100, "maximum": 100, "multipleOf": 0.5},
                                       "y": {"type": "number", "minimum": -100, "maximum": 100, "multipleOf": 0.5}},
      "required": ["x", "y"], "additionalProperties": False}),
    ("a to-do list of up to 3 tasks, each with a title and a done flag",
     {"type": "object", "properties": {"tasks": {"type": "array", "maxItems": 3, "items": {
         "type": "object", "properties": {"title": NAME, "done": {"type": "boolean"}},
         "required": ["title", "done"], "additionalProperties": False}}},
      "required": ["tasks"], "additionalProperties": False}),
    ("an HTTP status: code and reason",
     {"type": "object", "properties": {"code": {"enum": [200, 201, 400, 404, 500]}, "reason": SHORT},
      "required": ["code", "reason"], "additionalProperties": False}),
    ("an email address",
     {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.(com|org)$"}},
      "required": ["email"], "additionalProperties": False}),
    ("a user account: username, role, and optional age",
     {"type": "object", "properties": {"username": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,11}$"},
                                       "role": {"enum": ["admin", "editor", "viewer"]},
                                       "age": {"type": "integer", "minimum": 13, "maximum": 99}},
      "required": ["username", "role"], "additionalProperties": False}),
    ("a temperature reading in Celsius",
     {"type": "object", "properties": {"celsius": {"type": "number", "minimum": -90, "maximum": 60, "multipleOf": 0.1},
                                       "city": SHORT},
      "required": ["celsius", "city"], "additionalProperties": False}),
    ("a matrix of 2 rows of 2 numbers",
     {"type": "object", "properties": {"matrix": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
         "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": -9, "maximum": 9}}}},
      "required": ["matrix"], "additionalProperties": False}),
    ("a recipe: name, 1 to 3 ingredients with quantity, and minutes",
     {"type": "object", "properties": {
         "name": NAME,
         "ingredients": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
             "type": "object", "properties": {"item": SHORT, "grams": {"type": "integer", "minimum": 1, "maximum": 999}},
             "required": ["item", "grams"], "additionalProperties": False}},
         "minutes": {"type": "integer", "minimum": 1, "maximum": 240}},
      "required": ["name", "ingredients", "minutes"], "additionalProperties": False}),
    ("a rating from 1 to 5 stars with an optional comment",
     {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                                       "comment": {"type": ["string", "null"], "maxLength": 24}},
      "required": ["stars"], "additionalProperties": False}),
    ("a company: name, founded year, up to 2 offices each with a city and an employee count",
     {"type": "object", "properties": {
         "company": NAME, "founded": {"type": "integer", "minimum": 1800, "maximum": 2026},
         "offices": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
             "type": "object", "properties": {"city": SHORT, "employees": {"type": "integer", "minimum": 1,
                                                                           "maximum": 100000}},
             "required": ["city", "employees"], "additionalProperties": False}}},
      "required": ["company", "founded", "offices"], "additionalProperties": False}),
]

assert len(SCHEMAS) == 20


def random_allowed_step(c, rng, tok, n_vocab: int, eog, out: list) -> bool:
    """One step of a random walk under constraint c (a pydecode Constraint with a budget): a
    token the grammar allows, short ones more often (they reach the awkward states: inside
    escapes, numbers, keys), consumed and appended to out with what it forces. False when no
    token is allowed."""
    import numpy as np

    c._mask()
    allowed = [t for t in np.flatnonzero(np.unpackbits(c.words.view(np.uint8), bitorder="little"))
               if t < n_vocab and t not in eog]
    if not allowed:
        return False
    t = int(rng.choice(allowed) if rng.random() < 0.5 else min(rng.sample(allowed, min(8, len(allowed))),
                                                                key=lambda i: len(tok.token_bytes(i))))
    assert c.matcher.consume_token(t)
    c.budget.read([t])
    out.append(t)
    out += c.forced()
    return True


def checked_closing(c, tok, out: list) -> str:
    """The text of out followed by the budget's shortest closing, after checking that the
    grammar accepts the closing and is complete with it."""
    got = c.budget.closing()
    assert got is not None, f"no closing after {tok.decode(out)!r}"
    text, toks = got
    m = c.matcher.deep_copy()
    assert m.consume_tokens(toks) and m.is_accepting(), \
        f"closing {text!r} after {tok.decode(out)!r} refused or incomplete"
    return tok.decode(out + toks)
