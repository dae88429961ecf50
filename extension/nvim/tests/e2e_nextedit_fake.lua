-- Next edits against the scripted server (tests/fake_server.py with QD_FAKE_INLINE_EDIT=1):
-- accepting ghost text asks for the next edit at once, for the version the client sent; the edit
-- shows in Insert mode and typing clears it; an answer for another version is never shown;
-- :QuickdraftStatus shows the next edit's stats.
--
-- Driven by tests/e2e/test_nvim_nextedit.py: QD_PLUGIN, QD_CMD, QD_FILE, QD_FAKE_LOG, QD_RESULT.

vim.opt.runtimepath:prepend(os.getenv('QD_PLUGIN'))
local H = dofile(os.getenv('QD_PLUGIN') .. '/tests/harness.lua')

vim.cmd('filetype on')

local api = vim.api
local quickdraft = require('quickdraft')
local nextedit = require('quickdraft.nextedit')

quickdraft.setup({
  cmd = vim.json.decode(os.getenv('QD_CMD')),
  inline = 'plugin',
  completion = { enable = false },
  debounce_ms = 30,
  -- Longer than the scenario's waits in Normal mode: only the events under test ask.
  next_edit = { debounce_ms = 5000 },
})

H.run(function()
  vim.cmd.edit(os.getenv('QD_FILE'))
  local bufnr = api.nvim_get_current_buf()
  local client = H.attached_client(20000)
  if not H.check('the server starts and attaches to the buffer', client ~= nil) then
    return
  end

  -- A new line, the ghost text, <Tab>.
  api.nvim_win_set_cursor(0, { 2, 0 })
  H.type('o')
  local ghost = H.wait(function()
    return H.ghost_text()
  end, 5000)
  H.eq('the ghost text shows the suggestion', 'total = add(1, 2)', ghost)
  local asked_before = #H.fake_log_events('copilotInlineEdit')
  H.type('<Tab>')
  local accepted_version = vim.lsp.util.buf_versions[bufnr]
  local asked = H.wait(function()
    local requests = H.fake_log_events('copilotInlineEdit')
    return #requests > asked_before and requests[#requests]
  end, 5000)
  H.check('accepting the suggestion asks for the next edit at once', asked and H.mode():sub(1, 1) == 'i',
    { asked = asked, mode = H.mode() })
  H.eq('the request carries the version the client sent', accepted_version, asked and asked.version)
  local shown = H.wait(function()
    return nextedit.current()
  end, 5000)
  H.check('the edit is shown in Insert mode after accepting', shown ~= nil and H.mode():sub(1, 1) == 'i',
    { counts = nextedit.counts, mode = H.mode() })
  H.check('the server is told it was shown', H.wait(function()
    local shows = H.fake_log_events('didShowInlineEdit')
    return #shows == 1 and shows[1].item.text == 'plus'
  end, 5000), H.fake_log_events('didShowInlineEdit'))
  local status_lines = H.wait(function()
    for _, line in ipairs(quickdraft.show_status()) do
      if line == 'next edit: 42 ms · 2.50 tokens per forward · 1 edit (6 of 8 tokens copied)' then
        return true
      end
    end
  end, 5000)
  H.check(":QuickdraftStatus shows the next edit's latency and tokens per forward", status_lines,
    quickdraft.show_status())
  H.eq("the completions' stats stay the completion's", 12.5, quickdraft.status().last.latency_ms)

  H.type('x')
  H.wait(function()
    return nextedit.current() == nil
  end, 2000)
  H.check('typing clears it', nextedit.current() == nil
    and #api.nvim_buf_get_extmarks(0, nextedit.ns, 0, -1, {}) == 0)

  -- The server answers for the version before the one asked: never shown.
  local stale_before = nextedit.counts.stale
  local before = #H.fake_log_events('copilotInlineEdit')
  H.type('<BS>STALE<Esc>')
  H.check('leaving Insert mode asks', H.wait(function()
    return #H.fake_log_events('copilotInlineEdit') > before
  end, 5000))
  H.wait(function()
    return nextedit.counts.stale > stale_before
  end, 5000)
  H.check('an answer for another version is never shown', nextedit.counts.stale == stale_before + 1
    and nextedit.current() == nil and #api.nvim_buf_get_extmarks(0, nextedit.ns, 0, -1, {}) == 0,
    nextedit.counts)

  -- Normal-mode <Tab> and <Esc> keep their meaning when no edit is shown (<Tab> is <C-i>).
  H.eq('no edit shown', nil, nextedit.current())
  vim.cmd('normal! m`')
  api.nvim_win_set_cursor(0, { 1, 0 })
  H.type('<C-o>')
  H.eq('<C-o> goes back', 3, api.nvim_win_get_cursor(0)[1])
  H.type('<Tab>')
  H.eq('<Tab> without an edit jumps forward in the jump list, as <C-i>', 1, api.nvim_win_get_cursor(0)[1])

  -- Handlers of this client get ctx.request_id (Neovim 0.11 gives none; sidekick.nvim needs it),
  -- through `client:request` and the deprecated `client.request` alike.
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.textDocument.version = vim.lsp.util.buf_versions[bufnr]
  local seen = {}
  local _, colon_id = client:request('textDocument/copilotInlineEdit', params, function(_, _, ctx)
    seen.colon = ctx.request_id
  end, bufnr)
  local _, dot_id = client.request('textDocument/copilotInlineEdit', params, function(_, _, ctx)
    seen.dot = ctx.request_id
  end, bufnr)
  H.wait(function()
    return seen.colon and seen.dot
  end, 5000)
  H.eq('handlers get ctx.request_id', { colon = colon_id, dot = dot_id }, seen)
  H.data.counts = nextedit.counts
end)
