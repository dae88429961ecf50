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
local nextedit = H.setup_next_edits()

H.run(function()
  local path = os.getenv('QD_FILE')
  vim.cmd.edit(path)
  if not H.check('the server starts and attaches to the buffer', H.attached_client(30000) ~= nil) then
    return
  end
  -- Rename `width` to `w` in the signature: `cw` on it, then <Esc>.
  api.nvim_win_set_cursor(0, { 1, 9 })
  H.type('cww<Esc>')
  local first = H.tab_tab(nextedit, 'first use', nil)
  if first == nil then
    return
  end
  -- Applying it changed the buffer: the next request (after the debounce) gets the next use.
  local empty = nextedit.counts.empty
  local second = H.tab_tab(nextedit, 'second use', first)
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
