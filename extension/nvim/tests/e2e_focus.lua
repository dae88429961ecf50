-- End-to-end scenario against tests/fake_server.py: `textDocument/didFocus` tells the server
-- which document has focus and where the cursor is (quickdraft.focus). The server negotiates
-- UTF-16 here, so a position on a line with "é" and "😀" differs from the byte column.
--
-- Driven by tests/e2e/test_nvim.py:
--   QD_PLUGIN, QD_CMD, QD_RESULT, QD_FAKE_LOG, QD_FILE_A and QD_FILE_B (small Python files; the
--   second line of B holds non-ASCII text), QD_FILE_BIG (a Python file over 4096 bytes),
--   QD_FILE_NOTES (a text file: not attached)

vim.opt.runtimepath:prepend(os.getenv('QD_PLUGIN'))
local H = dofile(os.getenv('QD_PLUGIN') .. '/tests/harness.lua')

vim.cmd('filetype on')

local DEBOUNCE_MS = 400
-- How long to wait before concluding that nothing more will be sent.
local QUIET_MS = DEBOUNCE_MS + 400

local files = {
  a = os.getenv('QD_FILE_A'),
  b = os.getenv('QD_FILE_B'),
  big = os.getenv('QD_FILE_BIG'),
  notes = os.getenv('QD_FILE_NOTES'),
}
local names = {}
for name, path in pairs(files) do
  names[vim.uri_from_fname(path)] = name
end

local function focus_events()
  return H.fake_log_events('didFocus')
end

--- The didFocus notifications as { file name, line, character }.
local function sent()
  return vim.tbl_map(function(event)
    local p = event.params
    return { names[p.textDocument.uri] or p.textDocument.uri, p.position.line, p.position.character }
  end, focus_events())
end

--- Wait until `count` notifications have arrived, then for QUIET_MS more; returns them all.
local function settle(count)
  H.wait(function()
    return #focus_events() >= count
  end, 5000)
  H.sleep(QUIET_MS)
  return sent()
end

local quickdraft = require('quickdraft')
quickdraft.setup({
  cmd = vim.json.decode(os.getenv('QD_CMD')),
  filetypes = { 'python' },
  focus_debounce_ms = DEBOUNCE_MS,
  context = { maxDocumentBytes = 4096 },
})

H.run(function()
  vim.cmd.edit(files.a)
  local client = H.attached_client(20000)
  if not H.check('the server starts and attaches to the buffer', client ~= nil) then
    return
  end
  H.eq('the client negotiated UTF-16 (the fake server insists)', 'utf-16', client.offset_encoding)
  local expected = { { 'a', 0, 0 } }
  H.eq('the buffer that has focus when the server attaches is announced', expected, settle(1))
  local first = focus_events()[1]
  H.eq('didFocus carries the document and the cursor', {
    textDocument = { uri = vim.uri_from_fname(files.a) },
    position = { line = 0, character = 0 },
  }, first and first.params)
  H.eq('in the negotiated encoding (as the server reads it)', 'utf-16', first and first.encoding)

  -- Switching buffers: each change of focus, at once.
  vim.cmd.split(files.b)
  table.insert(expected, { 'b', 0, 0 })
  H.eq('a buffer opened in a new window gains focus', expected, settle(#expected))
  vim.cmd.wincmd('p')
  table.insert(expected, { 'a', 0, 0 })
  H.eq('going to the other window announces its document', expected, settle(#expected))
  vim.cmd.wincmd('p')
  table.insert(expected, { 'b', 0, 0 })
  H.eq('going back and forth between windows announces each', expected, settle(#expected))
  vim.cmd('wincmd p | wincmd p')
  H.eq('passing through a window within one command: nothing', expected, settle(#expected))
  vim.cmd.split()
  vim.cmd.close()
  H.eq('another window on the same document at the same place: nothing', expected, settle(#expected))

  -- Moving the cursor without typing: once, DEBOUNCE_MS after the last move.
  H.type('j')
  H.type('w')
  H.type('$')
  local line = vim.api.nvim_get_current_line()
  local col = vim.api.nvim_win_get_cursor(0)[2]
  -- s = "héllo 😀 wörld": the closing quote is byte 23, UTF-16 unit 19 ("😀" takes two)
  H.eq('the test line', 's = "héllo 😀 wörld"', line)
  H.eq('the cursor is on the closing quote', 23, col)
  table.insert(expected, { 'b', 1, 19 })
  H.eq('a burst of moves sends one didFocus, for where it ended, in UTF-16', expected, settle(#expected))
  local events = focus_events()
  H.eq('the server reads the text before the cursor at that position', line:sub(1, col),
    events[#events] and events[#events].prefix)

  H.type('h')
  H.type('l')
  H.eq('moves that end where the last one was sent: nothing', expected, settle(#expected))
  H.type('0')
  -- an edit that leaves the cursor where it is (as a formatter or another plugin makes)
  vim.api.nvim_buf_set_lines(0, -1, -1, false, { '# added below' })
  H.eq('a move followed by an edit within the quiet time: nothing', expected, settle(#expected))

  -- Typing: the cursor moves with each key, but no didFocus while typing.
  H.type('o')
  H.type('x')
  H.type('y')
  H.type('z')
  H.eq('in Insert mode', 'i', H.mode())
  H.eq('typing sends nothing', expected, settle(#expected))
  H.type('<Left>')
  H.type('<Del>') -- an edit where the cursor stays
  H.eq('the line after <Del>', 'xy', vim.api.nvim_get_current_line())
  H.eq('a move followed by typing within the quiet time: nothing', expected, settle(#expected))
  H.type('<Left>')
  table.insert(expected, { 'b', 2, 1 })
  H.eq('a move in Insert mode without typing is sent', expected, settle(#expected))
  events = focus_events()
  H.eq('the server has the typed text before the didFocus (didChange first)', 'x',
    events[#events] and events[#events].prefix)
  H.type('<Esc>')
  table.insert(expected, { 'b', 2, 0 })
  H.eq('leaving Insert mode moves the cursor back: sent', expected, settle(#expected))

  -- Buffers the server does not complete: nothing.
  vim.cmd.edit(files.big)
  H.check('the large buffer is attached', H.wait(function()
    return client.attached_buffers[vim.api.nvim_get_current_buf()]
  end, 5000))
  H.type('j')
  H.eq('a buffer over context.max_document_bytes: nothing, neither on focus nor on moves', expected,
    settle(#expected))
  vim.cmd.edit(files.notes)
  H.type('j')
  H.eq('a buffer not attached: nothing', expected, settle(#expected))
  vim.cmd.buffer(vim.fn.bufnr(files.b))
  H.eq('back to the document the server was told last: nothing', expected, settle(#expected))

  -- A move followed at once by a change of focus: only the change is sent.
  vim.cmd.buffer(vim.fn.bufnr(files.a))
  table.insert(expected, { 'a', 0, 0 })
  H.eq('to another document: sent', expected, settle(#expected))
  H.type('j')
  vim.cmd.buffer(vim.fn.bufnr(files.b))
  table.insert(expected, { 'b', 2, 0 })
  H.eq('a change of focus drops the move pending before it', expected, settle(#expected))

  H.data.sent = sent()
end)
