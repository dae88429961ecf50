-- Next edits from the rename rule, end to end: the real `quickdraft serve` with its default
-- next-edit settings (rules first; the scripted backend never writes, so every edit shown is the
-- rules'). Renames a parameter in Normal mode; the rest of the rename is drawn at its next use,
-- <Tab> jumps there and <Tab> applies it; the next answer is drawn at the use after it and a
-- second pair of <Tab>s applies that too; then nothing is left to propose, and the file on disk
-- after :w is the whole rename.
--
-- Driven by tests/e2e/test_nvim_nextedit.py: QD_PLUGIN, QD_CMD (JSON list), QD_FILE, QD_RESULT.

vim.opt.runtimepath:prepend(os.getenv('QD_PLUGIN'))
local H = dofile(os.getenv('QD_PLUGIN') .. '/tests/harness.lua')

vim.cmd('filetype on')

local api = vim.api
require('quickdraft').setup({
  cmd = vim.json.decode(os.getenv('QD_CMD')),
  inline = 'plugin',
  completion = { enable = false },
  next_edit = { debounce_ms = 150 },
})
local nextedit = require('quickdraft.nextedit')

--- Wait for an edit other than `previous` to be shown; tab to it and apply it. Returns what
--- was shown (nil when none came).
local function tab_tab(label, previous)
  local shown = H.wait(function()
    local current = nextedit.current()
    if current ~= nil and current ~= previous then
      return current
    end
  end, 30000)
  if not H.check(label .. ': an edit is drawn', shown ~= nil, { counts = nextedit.counts, text = H.text() }) then
    return nil
  end
  local first = shown.edits[1]
  H.data[label] = { range = first.item.range, text = first.text }
  H.type('<Tab>')
  H.wait(function()
    return api.nvim_win_get_cursor(0)[1] == first.range[1] + 1
  end, 2000)
  H.eq(label .. ': <Tab> moves the cursor to it', { first.range[1] + 1, first.range[2] },
    api.nvim_win_get_cursor(0))
  local expected = H.with_edits(H.text(), { first.item })
  H.type('<Tab>')
  H.wait(function()
    return H.text() == expected
  end, 2000)
  H.eq(label .. ': the second <Tab> applies it', expected, H.text())
  return shown
end

H.run(function()
  local path = os.getenv('QD_FILE')
  vim.cmd.edit(path)
  if not H.check('the server starts and attaches to the buffer', H.attached_client(30000) ~= nil) then
    return
  end
  -- Rename `width` to `w` in the signature: `cw` on it, then <Esc>.
  api.nvim_win_set_cursor(0, { 1, 9 })
  H.type('cww<Esc>')
  local first = tab_tab('first use', nil)
  if first == nil then
    return
  end
  -- Applying it changed the buffer: the next request (after the debounce) gets the next use.
  local empty = nextedit.counts.empty
  local second = tab_tab('second use', first)
  if second == nil then
    return
  end
  -- Nothing is left: the next answer is no edit, and nothing is drawn.
  H.check('then the answer is no edit', H.wait(function()
    return nextedit.counts.empty > empty
  end, 10000), nextedit.counts)
  H.eq('and nothing is drawn', nil, nextedit.current())
  vim.cmd('silent write')
  H.data.on_disk = H.text_on_disk(path) -- the pytest compares it with the whole rename
end)
