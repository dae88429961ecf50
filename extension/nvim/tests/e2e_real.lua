-- End-to-end scenario against the real `quickdraft serve` (tiny random-init models): open a
-- Python file, type in Insert mode, wait for the ghost text, accept it with <Tab>.
--
-- Driven by tests/e2e/test_nvim.py:
--   QD_PLUGIN, QD_SERVER (JSON list: the quickdraft executable), QD_TARGET, QD_DRAFT, QD_FILE,
--   QD_RESULT

vim.opt.runtimepath:prepend(os.getenv('QD_PLUGIN'))
local H = dofile(os.getenv('QD_PLUGIN') .. '/tests/harness.lua')

vim.cmd('filetype on')

local server = vim.json.decode(os.getenv('QD_SERVER'))

local quickdraft = require('quickdraft')
local opts = {
  server_path = server[1],
  model = {
    target = os.getenv('QD_TARGET'),
    draft = os.getenv('QD_DRAFT'),
    device = 'cpu',
    calibrate = false,
  },
  decoding = { maxNewTokens = 24, minConfidence = 0 }, -- random tiny models are unsure of all
  languages = { python = { multiline = 'always' } },
  debounce_ms = 50,
}
if #server > 1 then
  -- e.g. `python -m quickdraft.cli`: `cmd` carries the prefix, the plugin still builds the rest.
  local config = require('quickdraft.config')
  local built = config.cmd(config.normalize(opts))
  table.remove(built, 1)
  opts.cmd = vim.list_extend(vim.deepcopy(server), built)
end
quickdraft.setup(opts)

H.run(function()
  vim.cmd.edit(os.getenv('QD_FILE'))
  local client = H.attached_client(120000, 100)
  if not H.check('the real server starts and attaches', client ~= nil) then
    return
  end
  H.data.cmd = quickdraft.status().cmd
  H.check('the server offers inline completion', client.server_capabilities.inlineCompletionProvider ~= nil,
    client.server_capabilities)

  -- Type a new line at the end of the file; keep typing until a suggestion shows (a random model
  -- may have nothing to say after some prefixes; the output is deterministic either way).
  H.type('Go')
  local ghost = require('quickdraft.ghost')
  local shown
  local attempts = { 'result = add(', '1, 2)', '<CR>print(', 'result', ')<CR>', 'def ', 'mul', '(x, y):<CR>' }
  for _, keys in ipairs(attempts) do
    local answered = ghost.answered
    H.type(keys)
    -- until the suggestion shows, or the server answered this position with nothing
    H.wait(function()
      return H.ghost_text() or ghost.answered > answered
    end, 60000, 50)
    shown = H.ghost_text()
    H.data.attempts = (H.data.attempts or 0) + 1
    if shown then
      break
    end
  end
  H.data.shown = shown
  if not H.check('ghost text appears while typing', shown ~= nil and shown ~= '') then
    return
  end
  local marks = H.ghost_marks()
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  H.check('the ghost text is an extmark with virt_text at the cursor',
    #marks == 1 and marks[1].row == row - 1 and marks[1].col == col and marks[1].virt_text ~= nil, marks)
  -- What accepting inserts; the extmark shows it with control characters made printable (^Q).
  local raw = quickdraft.suggestion() and quickdraft.suggestion().text
  H.data.suggestion = raw
  local printable = {}
  for _, line in ipairs(vim.split(raw or '', '\n', { plain = true })) do
    table.insert(printable, vim.fn.strtrans(line))
  end
  H.eq('the ghost text is the suggestion the plugin holds', table.concat(printable, '\n'), shown)

  local bufnr = vim.api.nvim_get_current_buf()
  H.data.text_before = H.text()
  local before_cursor = vim.api.nvim_buf_get_text(bufnr, 0, 0, row - 1, col, {})
  local after_cursor = vim.api.nvim_buf_get_text(bufnr, row - 1, col, -1, -1, {})
  H.data.text_before_cursor = table.concat(before_cursor, '\n')
  H.data.text_after_cursor = table.concat(after_cursor, '\n')

  H.type('<Tab>')
  local changed = H.wait(function()
    return H.text() ~= H.data.text_before
  end, 5000)
  H.data.text_after = H.text()
  H.check('accepting changes the buffer', changed)
  H.eq('accepting inserts exactly the suggestion', H.data.text_before_cursor .. raw .. H.data.text_after_cursor,
    H.data.text_after)

  H.type('<Esc>')
  H.wait(function()
    return quickdraft.status().totals.completions > 0
  end, 10000)
  local status = quickdraft.status()
  H.data.completions = status.totals.completions
  H.data.last_stats = status.last
  H.check('stats notifications arrive', status.totals.completions > 0, status.totals)
  local lines = quickdraft.show_status()
  H.data.status = lines
  H.check(':QuickdraftStatus shows the server running', table.concat(lines, '\n'):find('quickdraft: running', 1, true) ~= nil, lines)
end)
