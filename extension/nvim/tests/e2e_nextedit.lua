-- Next edits end to end: the real `quickdraft serve` (its document store, edit history, region,
-- diff and LSP ranges) with a model that finishes the rename the last edit started
-- (tests/e2e/test_inline_edit_lsp.py's RenamingBackend). Renames a parameter in Normal mode, then
-- checks the edit shown (removed text highlighted, new text as virtual text), <Tab> jumping to
-- it and applying it, the file on disk after :w, :QuickdraftStatus, and that an edit for
-- another version of the buffer is never shown nor applied.
--
-- Driven by tests/e2e/test_nvim_nextedit.py: QD_PLUGIN, QD_CMD (JSON list), QD_FILE, QD_RESULT.

vim.opt.runtimepath:prepend(os.getenv('QD_PLUGIN'))
local H = dofile(os.getenv('QD_PLUGIN') .. '/tests/harness.lua')

vim.cmd('filetype on')

local api = vim.api
local quickdraft = require('quickdraft')
local nextedit = require('quickdraft.nextedit')

-- What the server logs about didShowInlineEdit arrives as window/logMessage.
local logged = H.log_messages()

quickdraft.setup({
  cmd = vim.json.decode(os.getenv('QD_CMD')),
  inline = 'plugin',
  completion = { enable = false },
  next_edit = { debounce_ms = 150 },
})

--- The marks of the edit shown: { deleted = { {row, col, end_row, end_col, hl} }, added = {...} }
local function edit_marks()
  local out = { deleted = {}, added = {} }
  for _, mark in ipairs(api.nvim_buf_get_extmarks(0, nextedit.ns, 0, -1, { details = true })) do
    local d = mark[4]
    if d.hl_group then
      table.insert(out.deleted, { mark[2], mark[3], d.end_row, d.end_col, d.hl_group })
    end
    if d.virt_text then
      local lines = { d.virt_text[1][1] }
      for _, line in ipairs(d.virt_lines or {}) do
        table.insert(lines, line[1][1])
      end
      table.insert(out.added, { row = mark[2], col = mark[3], text = table.concat(lines, '\n'),
        hl = d.virt_text[1][2], pos = d.virt_text_pos })
    end
  end
  return out
end

H.run(function()
  local path = os.getenv('QD_FILE')
  vim.cmd.edit(path)
  local client = H.attached_client(30000)
  if not H.check('the server starts and attaches to the buffer', client ~= nil) then
    return
  end
  H.eq('the server offers next edits', true, client.server_capabilities.experimental.inlineEdit)

  -- Rename `width` to `w` in the signature, in Normal mode: `cw` on it, then <Esc>.
  api.nvim_win_set_cursor(0, { 1, 9 })
  H.type('cww<Esc>')
  local shown = H.wait(function()
    return nextedit.current()
  end, 60000)
  if not H.check('leaving Insert mode asks for the next edit, and it is shown', shown ~= nil,
      { counts = nextedit.counts, logged = logged }) then
    return
  end
  H.eq('the edit is for the version the client sent', vim.lsp.util.buf_versions[api.nvim_get_current_buf()],
    shown.version)
  H.data.edits = vim.tbl_map(function(e)
    return { range = e.item.range, text = e.text }
  end, shown.edits)
  local marks = edit_marks()
  H.data.marks = marks
  local first = shown.edits[1]
  H.eq('the text the edit removes is highlighted with QuickdraftEditDelete',
    { { first.range[1], first.range[2], first.range[3], first.range[4], 'QuickdraftEditDelete' } },
    marks.deleted)
  H.check('the text it puts in is shown after it as virtual text (QuickdraftEditAdd)',
    #marks.added == 1 and marks.added[1].text == first.text and marks.added[1].hl == 'QuickdraftEditAdd'
      and marks.added[1].row == first.range[3] and marks.added[1].col == first.range[4]
      and marks.added[1].pos == 'inline', marks.added)
  H.eq('QuickdraftEditDelete links to DiffDelete', 'DiffDelete',
    api.nvim_get_hl(0, { name = 'QuickdraftEditDelete' }).link)
  H.eq('QuickdraftEditAdd links to DiffAdd', 'DiffAdd', api.nvim_get_hl(0, { name = 'QuickdraftEditAdd' }).link)
  H.check('the server is told the edit was shown (didShowInlineEdit)', H.wait(function()
    for _, message in ipairs(logged) do
      if message:find('didShowInlineEdit', 1, true) then
        return true
      end
    end
  end, 5000), logged)

  -- :QuickdraftStatus: the last next edit's latency and tokens per forward.
  local status_lines = H.wait(function()
    local lines = quickdraft.show_status()
    for _, line in ipairs(lines) do
      if line:find('^next edit: [%d.]+ m?s · [%d.]+ tokens per forward · 1 edit') then
        return lines
      end
    end
  end, 5000)
  H.check(':QuickdraftStatus shows the last next edit: latency, tokens per forward', status_lines ~= nil,
    quickdraft.show_status())
  H.data.status = status_lines
  H.eq('a next edit is not counted as a completion', nil, quickdraft.status().last)

  -- <Tab>: to the edit; <Tab> there: applied.
  H.type('<Tab>')
  H.wait(function()
    return api.nvim_win_get_cursor(0)[1] == first.range[1] + 1
  end, 2000)
  H.eq('<Tab> moves the cursor to the start of the edit', { first.range[1] + 1, first.range[2] },
    api.nvim_win_get_cursor(0))
  H.check('the edit is still shown after the jump', nextedit.current() ~= nil)
  -- The text after the rename plus exactly the edits shown (the pytest checks what the scripted
  -- model's edits are; a real model's are whatever it wrote).
  local expected = H.with_edits(H.text(), vim.tbl_map(function(e)
    return e.item
  end, shown.edits))
  H.type('<Tab>')
  H.wait(function()
    return H.text() == expected
  end, 2000)
  H.eq('the second <Tab> applies it: the text is the edit shown', expected, H.text())
  H.eq('nothing is shown after applying', 0, #api.nvim_buf_get_extmarks(0, nextedit.ns, 0, -1, {}))
  vim.cmd("silent write")
  H.eq('the file on disk after :w is the text plus the edit', expected .. '\n', H.text_on_disk(path))
  H.data.on_disk = H.text_on_disk(path)

  -- Stale: rename the call of `area` to `surface` (lines away from the first rename, whose
  -- hunk it would otherwise join); once the edit for `def area` is shown, change the buffer
  -- and press <Tab> before Neovim reports the change: nothing is applied.
  api.nvim_win_set_cursor(0, { 6, 7 })
  H.eq('the cursor is on `area`', 'area', vim.fn.expand('<cword>'))
  H.type('ciwsurface<Esc>')
  local second = H.wait(function()
    return nextedit.current()
  end, 60000)
  if H.check('the next rename is shown too', second ~= nil, { nextedit.counts, H.text() }) then
    local shown_text = H.text()
    local stale_before = nextedit.counts.stale
    api.nvim_buf_set_lines(0, -1, -1, false, { '# a line typed meanwhile' })
    api.nvim_win_set_cursor(0, { second.edits[1].range[1] + 1, second.edits[1].range[2] })
    local applied = nextedit.jump_or_apply()
    H.eq('an edit for an older version is not applied', false, applied)
    H.eq('the buffer holds only the change made meanwhile', shown_text .. '\n# a line typed meanwhile', H.text())
    H.eq('and it is no longer shown', 0, #api.nvim_buf_get_extmarks(0, nextedit.ns, 0, -1, {}))
    H.eq('it counts as stale', stale_before + 1, nextedit.counts.stale)
    -- An answer for an older version is never shown.
    H.eq('show() refuses an edit for another version', false,
      nextedit.show(api.nvim_get_current_buf(), vim.tbl_extend('force', second, {})))
    H.eq('nothing drawn', 0, #api.nvim_buf_get_extmarks(0, nextedit.ns, 0, -1, {}))
    vim.cmd("silent write")
    H.eq('on disk: no edit applied', shown_text .. '\n# a line typed meanwhile\n', H.text_on_disk(path))
  end

  -- <Tab> and <Esc> keep their meaning when no edit is shown.
  H.eq('no edit shown', nil, nextedit.current())
  H.data.counts = nextedit.counts
end)
