"""Token sampling: logit edits, penalties, filtering and seeded Philox draws."""
