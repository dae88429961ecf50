-- End-to-end scenario against tests/fake_server.py (a scripted server), checking the plugin's own
-- behaviour exactly: ghost text, typing through it, accepting a word / a line / everything,
-- dismissing, the <Tab> fallback, settings sent to the server, stats and :QuickdraftStatus.
--
-- Driven by tests/e2e/test_nvim.py:
--   QD_PLUGIN (extension/nvim), QD_CMD (JSON list: the server command), QD_FILE, QD_RESULT,
--   QD_FAKE_LOG (the fake server's log), QD_FAKE_SUGGESTION, QD_FAKE_RANGE ("1": range variant)

vim.opt.runtimepath:prepend(os.getenv('QD_PLUGIN'))
local H = dofile(os.getenv('QD_PLUGIN') .. '/tests/harness.lua')

vim.cmd('filetype on')

local suggestion = os.getenv('QD_FAKE_SUGGESTION')
local range_variant = os.getenv('QD_FAKE_RANGE') == '1'

-- INFO lines of the server's stderr reach the LSP log only at this level (default WARN).
vim.lsp.log.set_level('info')

--- The LSP log's lines that hold `text`, as { level, line }.
local function lsp_log_lines(text)
  local out = {}
  local file = io.open(vim.lsp.log.get_filename(), 'r')
  if not file then
    return out
  end
  for line in file:lines() do
    if line:find(text, 1, true) then
      table.insert(out, { line:match('^%[(%u+)%]'), line })
    end
  end
  file:close()
  return out
end

local quickdraft = require('quickdraft')
quickdraft.setup({
  cmd = vim.json.decode(os.getenv('QD_CMD')),
  model = { target = '/models/target', device = 'cpu' },
  decoding = { maxNewTokens = 32 },
  languages = { python = { draftLength = 3, enabled = true } },
  debounce_ms = 30,
})

local expected_tree = {
  model = { target = '/models/target', device = 'cpu' },
  decoding = { max_new_tokens = 32 },
  languages = { python = { draft_length = 3, enabled = true } },
}

H.run(function()
  vim.cmd.edit(os.getenv('QD_FILE'))
  local client = H.attached_client(20000)
  if not H.check('the server starts and attaches to the buffer', client ~= nil) then
    return
  end
  H.eq('languageId of the buffer', 'python', vim.bo.filetype)

  -- The server's stderr (QD_FAKE_STDERR) is in the LSP log at the level each line carries.
  H.wait(function()
    return #lsp_log_lines('a failure for the test') > 0
  end, 5000)
  local function level_of(text)
    local found = lsp_log_lines(text)
    return #found == 1 and found[1][1] or found
  end
  H.eq("stderr: llama.cpp's load warning is a warning", 'WARN', level_of("control-looking token: 128247 '</s>'"))
  H.eq('stderr: a line after a warning continues it', 'WARN', level_of('a line that continues the warning'))
  H.eq('stderr: an INFO record is info', 'INFO', level_of('INFO quickdraft.lsp.server: loading: loading models'))
  H.eq('stderr: a line after it without a level is info', 'INFO', level_of('llama_model_loader: loaded meta data'))
  H.eq('stderr: a traceback is an error', { 'ERROR', 'ERROR', 'ERROR' }, {
    level_of('Traceback (most recent call last):'), level_of('File "fake_server.py", line 1'),
    level_of('ValueError: a failure for the test') })
  -- This server never sends $/quickdraft/status (as older servers): starting until its stats.
  H.eq('without $/quickdraft/status the statusline says starting until the first stats', 'qd … starting',
    quickdraft.statusline())

  H.wait(function()
    return #H.fake_log_events('didChangeConfiguration') > 0
  end, 5000)
  H.eq('initializationOptions is the config tree', { expected_tree }, H.fake_log_events('initialize'))
  H.eq('didChangeConfiguration carries the config tree', { expected_tree }, H.fake_log_events('didChangeConfiguration'))

  if range_variant then
    -- The server answers with a range over the word before the cursor and repeats it.
    H.type('Gores')
    local shown = H.wait(function()
      return H.ghost_text()
    end, 10000)
    H.eq('ghost text leaves out what the range covers and is already typed', suggestion, shown)
    H.type('<Tab>')
    local last = H.wait(function()
      local lines = vim.api.nvim_buf_get_lines(0, -3, -1, false)
      return lines[1]:find('^res') and lines
    end, 5000)
    H.eq('accepting replaces the range with the item', vim.split('res' .. suggestion, '\n'), last)
    return
  end

  -- New line at the end, Insert mode: a suggestion appears as ghost text.
  H.type('Go')
  H.eq('in Insert mode', 'i', H.mode())
  local shown = H.wait(function()
    return H.ghost_text()
  end, 10000)
  H.eq('ghost text shows the suggestion', suggestion, shown)
  local marks = H.ghost_marks()
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  H.check('ghost text sits at the cursor, inline, highlighted', marks[1] and marks[1].row == row - 1
    and marks[1].col == col and marks[1].pos == 'inline' and marks[1].hl == 'QuickdraftSuggestion', marks)
  H.eq('the buffer is unchanged by the ghost text', '', vim.api.nvim_get_current_line())
  local requests = #H.fake_log_events('inlineCompletion')
  H.check('the request was automatic', H.fake_log_events('inlineCompletion')[requests].trigger == 2)

  -- Typing the suggestion's own characters keeps it, shortened, without asking again.
  H.type('tot')
  H.sleep(300)
  H.eq('typing through keeps the rest', suggestion:sub(4), H.ghost_text())
  H.eq('no new request while typing through', requests, #H.fake_log_events('inlineCompletion'))

  -- Accept a word, then a line.
  H.type('<M-Right>')
  H.eq('accept word inserts the next word', 'total', vim.api.nvim_get_current_line())
  H.eq('the rest stays shown', suggestion:sub(6), H.ghost_text())
  H.type('<M-Down>')
  local first_line = vim.split(suggestion, '\n')[1]
  H.eq('accept line inserts the rest of the line', first_line, vim.api.nvim_get_current_line())
  H.eq('the next line stays shown', suggestion:sub(#first_line + 1), H.ghost_text())

  -- Accept everything.
  H.type('<Tab>')
  local expected = vim.split(suggestion, '\n')
  H.eq('accept inserts the whole rest', expected, vim.api.nvim_buf_get_lines(0, -#expected - 1, -1, false))
  local last_line = vim.api.nvim_buf_line_count(0)
  H.eq('the cursor ends after the inserted text', { last_line, #expected[#expected] },
    vim.api.nvim_win_get_cursor(0))

  -- A new suggestion comes for the new position; <C-]> dismisses it.
  H.check('a new suggestion after accepting', H.wait(function()
    return H.ghost_text()
  end, 10000) ~= nil)
  H.type('<C-]>')
  H.eq('dismiss hides the ghost text', {}, H.ghost_marks())

  -- With nothing shown, <Tab> is a tab.
  H.type('<Tab>')
  local after_tab = vim.api.nvim_get_current_line()
  H.check('<Tab> without a suggestion indents as usual', after_tab:sub(1, #expected[#expected]) == expected[#expected]
    and after_tab:sub(#expected[#expected] + 1):match('^%s+$') ~= nil, after_tab)

  -- Several candidates: <M-]> asks again explicitly (the server then sends all of them) and
  -- shows the second; <M-[> goes back, wrapping; accepting reports the item's index.
  H.type('<CR>choose')
  H.eq('one candidate at first, no counter', 'choice_one()', H.wait(function()
    return H.ghost_text() == 'choice_one()' and H.ghost_text()
  end, 10000))
  H.type('<M-]>')
  local second = H.wait(function()
    local text = H.ghost_text()
    return text ~= 'choice_one()' and text
  end, 10000)
  H.eq('<M-]> shows the second candidate with its place', 'choice_two() (2/3)', second)
  local asked = H.fake_log_events('inlineCompletion')
  H.eq('it asked again as an explicit request', 1, asked[#asked].trigger)
  H.type('<M-[><M-[>')
  H.eq('<M-[> goes back and wraps around', 'choice_three() (3/3)', H.ghost_text())
  H.type('<M-]><M-]>')
  H.eq('and forward again', 'choice_two() (2/3)', H.ghost_text())
  H.type('<Tab>')
  H.check('accepting the second inserts it', vim.endswith(vim.api.nvim_get_current_line(), 'choosechoice_two()'),
    vim.api.nvim_get_current_line())
  local accepted = H.wait(function()
    local events = H.fake_log_events('accepted')
    return #events > 0 and events
  end, 5000)
  H.eq('the server hears which item was accepted', { text = 'choice_two()', index = 1 },
    accepted and accepted[#accepted])
  H.type('<CR>')

  -- Leaving Insert mode clears the ghost text.
  H.wait(function()
    return H.ghost_text()
  end, 10000)
  H.type('<Esc>')
  H.sleep(100)
  H.eq('leaving Insert mode hides the ghost text', {}, H.ghost_marks())

  -- Settings changed at run time reach the server.
  quickdraft.update({ decoding = { maxNewTokens = 16 } })
  local changes = H.wait(function()
    local events = H.fake_log_events('didChangeConfiguration')
    return #events >= 2 and events
  end, 5000)
  H.eq('update() sends didChangeConfiguration with the new tree',
    vim.tbl_deep_extend('force', expected_tree, { decoding = { max_new_tokens = 16 } }),
    changes and changes[#changes])

  -- Stats from $/quickdraft/stats and :QuickdraftStatus.
  local status = quickdraft.status()
  H.check('stats notifications are counted', status.totals.completions >= 1, status.totals)
  H.eq('the last stats are kept', 12.5, status.last and status.last.latency_ms)
  local lines = quickdraft.show_status()
  local text = table.concat(lines, '\n')
  H.check(':QuickdraftStatus shows the server running', text:find('quickdraft: running', 1, true) ~= nil, lines)
  H.check(':QuickdraftStatus shows the last stats', text:find('last: 13 ms · drafted 6 of 10 tokens', 1, true) ~= nil, lines)
  H.check(':QuickdraftStatus command exists', vim.fn.exists(':QuickdraftStatus') == 2)
  H.eq('statusline text', 'qd 13 ms · drafted 6 of 10 tokens', quickdraft.statusline())
  H.check(':QuickdraftStatus details the drafts by source', text:find('drafts: copied from open files 4 of 5 accepted, draft model 2 of 3 accepted', 1, true) ~= nil, lines)
  H.data.status = lines

  -- The server's state: the scenario makes the server send what the real one sends while its
  -- models load and when they fail ($/quickdraft/status, work-done progress).
  local status_events = 0
  vim.api.nvim_create_autocmd('User', {
    pattern = 'QuickdraftStatus',
    callback = function()
      status_events = status_events + 1
    end,
  })
  local function server_command(command, arguments)
    local done = false
    client:request('workspace/executeCommand', { command = command, arguments = arguments }, function()
      done = true
    end)
    H.wait(function()
      return done
    end, 5000)
  end
  local function send(method, params)
    server_command('fake.notify', { method, params })
  end
  local function statusline_becomes(expected)
    return H.wait(function()
      return quickdraft.statusline() == expected and expected
    end, 5000) or quickdraft.statusline()
  end
  server_command('fake.createProgress', { 'load' })
  send('$/quickdraft/status', { state = 'loading', message = 'converting the target model' })
  H.eq('loading: the statusline shows the server message', 'qd … loading: converting the target model',
    statusline_becomes('qd … loading: converting the target model'))
  server_command('fake.progress', { 'load', { kind = 'begin', title = 'quickdraft', message = 'converting', percentage = 10 } })
  H.eq('loading: work-done progress shows while it runs', 'qd … loading: converting (10%)',
    statusline_becomes('qd … loading: converting (10%)'))
  server_command('fake.progress', { 'load', { kind = 'report', message = 'calibrating', percentage = 60 } })
  H.eq('a progress report keeps the title of its begin', 'qd … loading: calibrating (60%)',
    statusline_becomes('qd … loading: calibrating (60%)'))
  H.eq('status() says loading, with the message and the progress',
    { 'loading', 'converting the target model', 'quickdraft: calibrating (60%)' },
    { quickdraft.status().state, quickdraft.status().message, quickdraft.status().progress })
  server_command('fake.progress', { 'load', { kind = 'end' } })
  H.eq('without progress the status message shows', 'qd … loading: converting the target model',
    statusline_becomes('qd … loading: converting the target model'))
  send('$/quickdraft/status', { state = 'ready', message = '' })
  H.eq('ready: the last stats again', 'qd 13 ms · drafted 6 of 10 tokens',
    statusline_becomes('qd 13 ms · drafted 6 of 10 tokens'))
  send('$/quickdraft/status', { state = 'error', message = 'models failed to load: out of memory' })
  H.eq('error: a clear mark and the message', 'qd ✗ error: models failed to load: out of memory',
    statusline_becomes('qd ✗ error: models failed to load: out of memory'))
  local error_lines = table.concat(quickdraft.show_status(), '\n')
  H.check(':QuickdraftStatus shows the error', error_lines:find('state: error: models failed to load: out of memory', 1, true) ~= nil,
    error_lines)
  send('$/quickdraft/status', { state = 'unavailable', message = 'cannot reach http://127.0.0.1:9/v1', backend = 'openai' })
  H.eq('unavailable: a clear mark and the message', 'qd ⚠ unavailable: cannot reach http://127.0.0.1:9/v1',
    statusline_becomes('qd ⚠ unavailable: cannot reach http://127.0.0.1:9/v1'))
  local remote_lines = table.concat(quickdraft.show_status(), '\n')
  H.check(':QuickdraftStatus names the remote engine', remote_lines:find('[remote engine]', 1, true) ~= nil, remote_lines)
  send('$/quickdraft/status', { state = 'running', message = 'not a state' })
  send('$/quickdraft/status', { state = 'ready', message = '', backend = 'openai' })
  H.eq('back to ready when the engine recovers (an unknown state is ignored)', 'qd 13 ms · drafted 6 of 10 tokens',
    statusline_becomes('qd 13 ms · drafted 6 of 10 tokens'))
  send('$/quickdraft/stats', { latencyMs = 0.2, cached = true, source = 'typed-ahead', tokens = 0, tokensPerForward = 0 })
  H.eq('a cached answer shows "cached"', 'qd 0 ms · cached', statusline_becomes('qd 0 ms · cached'))
  send('$/quickdraft/stats', { latencyMs = 900, cached = false, tokens = 8, tokensPerForward = 1.0,
    acceptedBySource = { ngram = 0, draft = 0 }, draftedBySource = { ngram = 0, draft = 0 } })
  H.eq('no draft tried: the latency alone', 'qd 900 ms', statusline_becomes('qd 900 ms'))
  send('$/quickdraft/stats', { latencyMs = 84, cached = false, tokens = 15, tokensPerForward = 2.5,
    acceptedBySource = { ngram = 12, draft = 0 }, draftedBySource = { ngram = 14, draft = 0 } })
  H.eq('drafts copied from the open files', 'qd 84 ms · copied 12 of 15 tokens',
    statusline_becomes('qd 84 ms · copied 12 of 15 tokens'))
  H.check('User QuickdraftStatus fires on each change', status_events >= 8, status_events)

  -- The completion menu (textDocument/completion through vim.lsp.completion / omnifunc).
  vim.o.completeopt = 'menu,menuone,noselect' -- show the menu even for one item
  H.type('o<C-]><C-x><C-o>')
  local words = H.wait(function()
    local info = vim.fn.complete_info({ 'items', 'pum_visible' })
    if info.pum_visible ~= 1 then
      return nil
    end
    return vim.tbl_map(function(item)
      return item.word
    end, info.items)
  end, 10000)
  H.check('<C-x><C-o> shows the server\'s completion items', words and vim.tbl_contains(words, vim.split(suggestion, '\n')[1]), words)
  H.type('<C-e><Esc>')

  -- Supersession at the server: the server holds a request on a line ending in "slow"; a
  -- keystroke meanwhile cancels it ($/cancelRequest), and the next request is answered.
  H.type('oslow')
  local asked = H.wait(function()
    for _, event in ipairs(H.fake_log_events('inlineCompletion')) do
      if event.prefix == 'slow' then
        return true
      end
    end
  end, 5000)
  H.check('the slow request reaches the server', asked)
  H.type('er')
  local cancelled = H.wait(function()
    local events = H.fake_log_events('cancelled')
    return #events > 0 and events
  end, 5000)
  H.eq('a keystroke cancels the request in flight at the server', { { line = vim.fn.line('.') - 1, prefix = 'slow' } },
    cancelled)
  H.eq('the request after it is answered', suggestion, H.wait(function()
    return H.ghost_text()
  end, 5000))
  H.eq('the burst "er" asks once, for where it ended', 0, #vim.tbl_filter(function(event)
    return event.prefix == 'slowe'
  end, H.fake_log_events('inlineCompletion')))
  H.type('<Esc>')
end)
