"""The suite covers protocol.md: every `## ` section has a case or a written reason, and TABLE.md is what the suite generates."""
from conformance import table

def test_every_section_has_a_case_or_a_reason():
  assert table.problems(table.cases()) == []

def test_table_md_is_current():
  """Rewrite it with python -m tests.conformance.table after adding or renaming a case."""
  assert table.TABLE_MD.read_text() == table.render(table.cases())
