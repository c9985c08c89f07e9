"""How bytes reach an agent. No Textual here (an import-hygiene test checks it)."""
