-- Unit tests of the plugin's pure logic. Run: nvim -l extension/nvim/tests/config_spec.lua
-- (the plugin directory is found from this file's path). Prints "N passed, M failed".

local here = debug.getinfo(1, 'S').source:sub(2)
local plugin = vim.fn.fnamemodify(here, ':p:h:h')
vim.opt.runtimepath:prepend(plugin)

local config = require('quickdraft.config')
local stats = require('quickdraft.stats')
local ghost = require('quickdraft.ghost')
local status = require('quickdraft.status')
local serverlog = require('quickdraft.serverlog')

local passed, failed = 0, 0
local function test(name, fn)
  local ok, err = pcall(fn)
  if ok then
    passed = passed + 1
  else
    failed = failed + 1
    io.stdout:write(('FAIL %s: %s\n'):format(name, err))
  end
end
local function eq(expected, actual)
  if not vim.deep_equal(expected, actual) then
    error(('expected %s, got %s'):format(vim.inspect(expected), vim.inspect(actual)), 2)
  end
end

test('to_snake follows config.py', function()
  eq('max_new_tokens', config.to_snake('maxNewTokens'))
  eq('draft_length', config.to_snake('draft_length'))
  eq('enabled', config.to_snake('enabled'))
  eq('max_new_tokens', config.to_snake('max-new-tokens'))
end)

test('defaults give an empty tree and a bare serve command', function()
  local opts = config.normalize({})
  eq({}, config.tree(opts))
  -- sent as an object, never as `[]` (the server would call that an invalid configuration)
  eq('{}', vim.json.encode(config.tree(opts)))
  eq({ 'quickdraft', 'serve' }, config.cmd(opts))
end)

test('options become the snake_case tree, unset values left out', function()
  local opts = config.normalize({
    model = { preset = 'qwen2.5-coder-1.5b', device = 'cpu', target = '', calibrate = false },
    decoding = { maxNewTokens = 48, draft_length = 6 },
    context = { maxPromptTokens = 1024 },
    cache = { memoryMb = 512, warmup = false },
    languages = { python = { draftLength = 4, enabled = true, multiline = 'never' }, markdown = { enabled = false } },
  })
  eq({
    model = { preset = 'qwen2.5-coder-1.5b', device = 'cpu', calibrate = false },
    decoding = { max_new_tokens = 48, draft_length = 6 },
    context = { max_prompt_tokens = 1024 },
    cache = { memory_mb = 512, warmup = false },
    languages = { python = { draft_length = 4, enabled = true, multiline = 'never' }, markdown = { enabled = false } },
  }, config.tree(opts))
  eq(false, config.language_enabled(opts, 'markdown'))
  eq(true, config.language_enabled(opts, 'python'))
  eq(true, config.language_enabled(opts, 'go'))
end)

test('edits.* reach the server settings', function()
  local opts = config.normalize({ edits = { enabled = false, linesAbove = 4, history_files = 2 } })
  eq({ edits = { enabled = false, lines_above = 4, history_files = 2 } }, config.tree(opts))
end)

test('setup refuses unknown options, naming them', function()
  local ok, err = pcall(config.normalize, { edit = { enabled = false }, debounce = 10 })
  eq(false, ok)
  eq(true, tostring(err):find('unknown setup options: debounce, edit', 1, true) ~= nil)
  -- options whose default is nil are known
  eq(true, (pcall(config.normalize, { cmd = { 'x' }, filetypes = { 'python' } })))
end)

test('the command carries the model flags, then server_args; cmd overrides all', function()
  local opts = config.normalize({
    server_path = '/venv/bin/quickdraft',
    server_args = { '--log-level', 'debug' },
    model = { target = '/m/t', draft = 'none', device = 'cpu', calibrate = false },
  })
  eq({ '/venv/bin/quickdraft', 'serve', '--target', '/m/t', '--draft', 'none', '--device', 'cpu',
       '--no-calibrate', '--log-level', 'debug' }, config.cmd(opts))
  eq(vim.NIL, config.tree(opts).model.draft)
  eq({ 'x', 'y' }, config.cmd(config.normalize({ cmd = { 'x', 'y' }, model = { target = 't' } })))
end)

test('normalize rejects wrong types', function()
  eq(false, (pcall(config.normalize, { server_args = 'x' })))
  eq(false, (pcall(config.normalize, { inline = 'sometimes' })))
  eq(false, (pcall(config.normalize, { debounce_ms = 'fast' })))
  eq(true, (pcall(config.normalize, { inline = false })))
end)

test('debounce_ms: whole milliseconds from 0 to MAX_DEBOUNCE_MS', function()
  eq(75, config.normalize({}).debounce_ms)
  eq(0, config.normalize({ debounce_ms = 0 }).debounce_ms)
  eq(config.MAX_DEBOUNCE_MS, config.normalize({ debounce_ms = config.MAX_DEBOUNCE_MS }).debounce_ms)
  for _, bad in ipairs({ -1, 12.5, config.MAX_DEBOUNCE_MS + 1, 'fast', true }) do
    local ok, err = pcall(config.normalize, { debounce_ms = bad })
    eq(false, ok)
    assert(tostring(err):find('debounce_ms: expected a whole number of milliseconds', 1, true), err)
  end
end)

test('focus_debounce_ms: whole milliseconds from 0 to MAX_FOCUS_DEBOUNCE_MS', function()
  eq(300, config.normalize({}).focus_debounce_ms)
  eq(0, config.normalize({ focus_debounce_ms = 0 }).focus_debounce_ms)
  eq(config.MAX_FOCUS_DEBOUNCE_MS,
    config.normalize({ focus_debounce_ms = config.MAX_FOCUS_DEBOUNCE_MS }).focus_debounce_ms)
  for _, bad in ipairs({ -1, 12.5, config.MAX_FOCUS_DEBOUNCE_MS + 1, 'slow', false }) do
    local ok, err = pcall(config.normalize, { focus_debounce_ms = bad })
    eq(false, ok)
    assert(tostring(err):find('focus_debounce_ms: expected a whole number of milliseconds', 1, true), err)
  end
end)

test('max_document_bytes: context.max_document_bytes, else the server default', function()
  eq(config.SERVER_MAX_DOCUMENT_BYTES, config.max_document_bytes(config.normalize({})))
  eq(4096, config.max_document_bytes(config.normalize({ context = { maxDocumentBytes = 4096 } })))
  eq(512, config.max_document_bytes(config.normalize({ context = { max_document_bytes = 512 } })))
  eq(config.SERVER_MAX_DOCUMENT_BYTES,
    config.max_document_bytes(config.normalize({ context = { maxDocumentBytes = 'lots' } })))
  eq(config.SERVER_MAX_DOCUMENT_BYTES,
    config.max_document_bytes(config.normalize({ context = { maxDocumentBytes = 0 } })))
end)

test('model.runtime goes into the tree and onto the command line as --runtime', function()
  local opts = config.normalize({ model = { preset = 'qwen2.5-coder-1.5b', runtime = 'llamacpp', dtype = 'auto' } })
  eq({ preset = 'qwen2.5-coder-1.5b', runtime = 'llamacpp', dtype = 'auto' }, config.tree(opts).model)
  eq({ 'quickdraft', 'serve', '--preset', 'qwen2.5-coder-1.5b', '--runtime', 'llamacpp', '--dtype', 'auto' },
    config.cmd(opts))
end)

test('list options replace the defaults', function()
  eq({ 'pyproject.toml' }, config.normalize({ root_markers = { 'pyproject.toml' } }).root_markers)
end)

test('stats line: the latency and what sped it up, never a rate that reads as a failure', function()
  eq('no completion yet', stats.format(nil))
  -- drafts accepted: N of the M new tokens; "copied" when all came from the n-gram drafter
  eq('84 ms · copied 12 of 15 tokens', stats.format({
    latency_ms = 83.6, tokens = 15, tokens_per_forward = 2.5,
    accepted_by_source = { ngram = 12, draft = 0 }, drafted_by_source = { ngram = 14, draft = 0 },
  }))
  eq('84 ms · drafted 12 of 20 tokens', stats.format({
    latency_ms = 83.6, tokens = 20, accepted_by_source = { ngram = 6, draft = 6 },
    drafted_by_source = { ngram = 8, draft = 8 },
  }))
  -- more accepted than kept (the answer was trimmed after): never more than the tokens
  eq('12.0 s · copied 10 of 10 tokens', stats.format({ latency_ms = 12000, tokens = 10,
    accepted_by_source = { ngram = 14 }, drafted_by_source = { ngram = 16 } }))
  -- no draft tried (the cost model chose plain decoding): the latency alone, no "0% acc"
  eq('310 ms', stats.format({ latency_ms = 310, tokens = 15, tokens_per_forward = 1.0,
    accepted_by_source = { ngram = 0, draft = 0 }, drafted_by_source = { ngram = 0, draft = 0 } }))
  eq('310 ms', stats.format({ latency_ms = 310, tokens = 15, accepted_by_source = {}, drafted_by_source = {} }))
  eq('310 ms', stats.format({ latency_ms = 310, tokens = 15 }))
  -- drafts tried, none accepted: nothing sped it up
  eq('310 ms', stats.format({ latency_ms = 310, tokens = 15, accepted_by_source = { ngram = 0 },
    drafted_by_source = { ngram = 4 } }))
  eq('-', stats.format({ latency_ms = 0 / 0 }))
  local totals = stats.new_totals()
  stats.add(totals, { latency_ms = 100, tokens = 10, accepted_by_source = { ngram = 3 }, drafted_by_source = { ngram = 4 } })
  stats.add(totals, { latency_ms = 50, tokens = 6, accepted_by_source = { draft = 1 }, drafted_by_source = { draft = 4 } })
  eq('2 completions, 16 tokens (4 from drafts), mean 75 ms', stats.format_totals(totals))
end)

test('stats details for :QuickdraftStatus', function()
  eq('15 tokens, 6 forwards of the model, drafts: copied from open files 12 of 14 accepted, draft model 0 of 3 accepted',
    stats.details(stats.normalize({ latencyMs = 84, tokens = 15, targetForwards = 6,
      acceptedBySource = { ngram = 12, draft = 0 }, draftedBySource = { ngram = 14, draft = 3 } })))
  eq('15 tokens, 15 forwards of the model, no drafts tried', stats.details({ tokens = 15, target_forwards = 15,
    drafted_by_source = { ngram = 0, draft = 0 } }))
  eq('answered from work done before (typed-ahead), no model work', stats.details({ cached = true, source = 'typed-ahead' }))
  eq(nil, stats.details(nil))
end)

test('camelCase stats are read as snake_case', function()
  local s = stats.normalize({ latencyMs = 41.2, tokens = 8, tokensPerForward = 3.2,
    acceptedBySource = { ngram = 3 }, draftedBySource = { ngram = 4 } })
  eq({ latency_ms = 41.2, tokens = 8, tokens_per_forward = 3.2,
    accepted_by_source = { ngram = 3 }, drafted_by_source = { ngram = 4 } }, s)
  eq('41 ms · copied 3 of 8 tokens', stats.format(s))
  eq(2, stats.normalize({ latencyMs = 1, latency_ms = 2 }).latency_ms)
  eq({}, stats.normalize(nil))
  local totals = stats.new_totals()
  stats.add(totals, { latencyMs = 10, tokens = 2 })
  eq(10, totals.last.latency_ms)
end)

test('a cached answer is "cached" with its latency; a low tokens-per-forward is noticed', function()
  local cached = stats.normalize({ latencyMs = 0.3, cached = true, source = 'typed-ahead', tokens = 0, tokensPerForward = 0 })
  eq('0 ms · cached', stats.format(cached))
  eq('cached', stats.format({ cached = true }))
  eq(false, stats.too_few_tokens_per_forward(cached))
  local low = { latency_ms = 900, tokens = 8, tokens_per_forward = 0.8, cached = false }
  eq('900 ms', stats.format(low))
  eq(true, stats.too_few_tokens_per_forward(low))
  eq(false, stats.too_few_tokens_per_forward({ tokens = 8, tokens_per_forward = 1.5 }))
  eq('50 ms', stats.format({ latency_ms = 50, tokens = 0, tokens_per_forward = 0 }))
  local totals = stats.new_totals()
  stats.add(totals, { latency_ms = 100, tokens = 10 })
  stats.add(totals, cached)
  stats.add(totals, { latency_ms = 50, tokens = 6 })
  eq(3, totals.completions)
  eq(1, totals.cached)
  eq('3 completions (1 cached), 16 tokens, mean 75 ms', stats.format_totals(totals))
  local only_cached = stats.new_totals()
  stats.add(only_cached, cached)
  eq('1 completions (1 cached), 0 tokens', stats.format_totals(only_cached))
end)

test('$/quickdraft/status params: known states only, one-line message', function()
  eq({ state = 'loading', message = 'converting the target', backend = 'local' },
    status.normalize({ state = 'loading', message = 'converting\n  the target ', backend = 'local' }))
  eq({ state = 'ready', message = '' }, status.normalize({ state = 'ready' }))
  eq(nil, status.normalize({ state = 'running' }))
  eq(nil, status.normalize({ message = 'x' }))
  eq(nil, status.normalize(nil))
end)

test('work-done progress as one line, gone once it ends', function()
  eq('quickdraft: converting the target (40%)',
    status.progress_text({ kind = 'report', title = 'quickdraft', message = 'converting the target', percentage = 40 }))
  eq('loading models', status.progress_text({ kind = 'begin', title = 'loading models' }))
  eq('(5%)', status.progress_text({ kind = 'report', percentage = 5 }))
  eq(nil, status.progress_text({ kind = 'end', message = 'done' }))
  eq(nil, status.progress_text({ kind = 'report' }))
  eq(nil, status.progress_text(nil))
end)

test('the state shown: the client first, then the server; older servers start until their stats', function()
  eq('starting', status.resolve('starting', { state = 'ready' }, true))
  eq('stopped', status.resolve('stopped', nil, false))
  eq('starting', status.resolve('running', nil, false))
  eq('ready', status.resolve('running', nil, true))
  eq('loading', status.resolve('running', { state = 'loading' }, true))
  eq('error', status.resolve('running', { state = 'error' }, false))
end)

test('statusline text for each state', function()
  local last = { latency_ms = 83.6, tokens = 15, accepted_by_source = { ngram = 12 }, drafted_by_source = { ngram = 14 } }
  eq('', status.line('inactive', nil, nil, last))
  eq('qd … starting', status.line('starting', nil, nil, nil))
  eq('qd … starting: loading (10%)', status.line('starting', nil, 'quickdraft: loading (10%)', nil))
  -- loading: the step, without the server's own "quickdraft:" and without saying "loading" twice
  eq('qd … loading', status.line('loading', '', nil, nil))
  eq('qd … loading models', status.line('loading', 'loading models', nil, nil))
  eq('qd … loading models', status.line('loading', 'starting', 'quickdraft: loading models', nil))
  eq('qd … loading: measuring step costs (once per machine)',
    status.line('loading', 'quickdraft: measuring step costs (once per machine)', nil, nil))
  eq('qd … loading: calibrating (60%)',
    status.line('loading', 'calibrating step costs', 'quickdraft: calibrating (60%)', nil))
  eq('qd … loading: converting: model.gguf', status.line('loading', '', 'converting: model.gguf', nil))
  eq('qd ✗ error: models failed to load', status.line('error', 'models failed to load', 'ignored', last))
  eq('qd ⚠ unavailable: cannot reach http://gpu:8000/v1', status.line('unavailable', 'cannot reach http://gpu:8000/v1', nil, last))
  eq('qd ✗ error', status.line('error', '', nil, nil))
  -- ready: a word until the first completion, then its latency and what sped it up
  eq('qd ready', status.line('ready', 'Qwen2.5-Coder-1.5B + 0.5B draft', nil, nil))
  eq('qd 84 ms · copied 12 of 14 tokens', status.line('ready', '', nil,
    { latency_ms = 83.6, tokens = 14, accepted_by_source = { ngram = 12 }, drafted_by_source = { ngram = 14 } }))
  eq('qd 2 ms · cached', status.line('ready', '', nil, { cached = true, latency_ms = 2 }))
  -- ready, with a request waiting over a second: what the model does for it, not the last answer
  eq('qd … reading app.py: 1,280 of 5,800 tokens', status.line('ready', '',
    'quickdraft: reading app.py: 1,280 of 5,800 tokens', { cached = true, latency_ms = 2 }))
  eq('qd 310 ms', status.line('ready', '', nil, { latency_ms = 310, tokens = 15, tokens_per_forward = 1,
    accepted_by_source = { ngram = 0, draft = 0 }, drafted_by_source = { ngram = 0, draft = 0 } }))
  eq('qd stopped', status.line('stopped', nil, nil, last))
  local long = string.rep('é', status.max_message + 10)
  eq('qd … loading: ' .. string.rep('é', status.max_message - 1) .. '…', status.line('loading', long, nil, nil))
end)

test('server stderr: each line at the level it carries', function()
  local log = serverlog.new()
  local levels = {}
  for _, line in ipairs({
    'llama_model_loader: loaded meta data with 29 key-value pairs', -- before any record: INFO
    "2026-12-01 10:00:00,123 WARNING llama_cpp: load: control-looking token: 128247 '</s>' was not control-type",
    '  a continuation of the warning',
    '2026-12-01 10:00:01,000 INFO quickdraft.lsp.server: loading: loading models',
    'main: build = 1 (abc)',
    '2026-12-01 10:00:02,000 DEBUG pygls.protocol: sending',
    '2026-12-01 10:00:03,000 ERROR quickdraft.lsp: request failed',
    '  File "x.py", line 3, in f',
    '2026-12-01 10:00:04,000 CRITICAL quickdraft: giving up',
    'WARNING:root:the default format of Python logging',
  }) do
    table.insert(levels, (log.classify(line)))
  end
  eq({ 'INFO', 'WARN', 'WARN', 'INFO', 'INFO', 'DEBUG', 'ERROR', 'ERROR', 'ERROR', 'WARN' }, levels)
end)

test('server stderr: tracebacks and other failures are errors; progress bars are info', function()
  local log = serverlog.new()
  eq('INFO', (log.classify('2026-12-01 10:00:00,000 INFO quickdraft: ok')))
  eq('ERROR', (log.classify('Traceback (most recent call last):')))
  eq('ERROR', (log.classify('  File "serve.py", line 1')), 'the traceback goes on')
  eq('ERROR', (log.classify('ValueError: bad model')))
  eq('WARN', (log.classify('2026-12-01 10:00:00,000 WARNING quickdraft: a warning again')))
  eq('ERROR', (serverlog.new().classify('quickdraft serve: error: unrecognized arguments: --runtime')))
  eq('ERROR', (serverlog.new().classify('GGML_ASSERT(n > 0) failed')))
  eq('INFO', (serverlog.new().classify('no errors: 0')))
  eq('INFO', (serverlog.new().classify('ErrorHandler registered')))
  local after_error = serverlog.new()
  after_error.classify('2026-12-01 10:00:03,000 ERROR quickdraft.lsp: request failed')
  local level, text = after_error.classify('\rconvert:   0%|          | 0/4 [00:00<?]\rconvert:  50%|#####     | 2/4 [00:01<00:01]')
  eq({ 'INFO', 'convert:  50%|#####     | 2/4 [00:01<00:01]' }, { level, text })
  eq('INFO', (after_error.classify('download model.gguf:  40%|####      | 400M/1.0G [00:10<00:15, 40MB/s]')))
end)

test('server stderr: chunks are joined into lines, each logged at its level', function()
  local logged = {}
  local function writer(level)
    return function(_, _, text)
      table.insert(logged, level .. ' ' .. text)
    end
  end
  local handler = serverlog.stderr_handler({
    debug = writer('DEBUG'), info = writer('INFO'), warn = writer('WARN'), error = writer('ERROR'),
  })
  handler(nil, '2026-12-01 10:00:00,123 WARN')
  handler(nil, 'ING llama_cpp: a warning\r\ncontinued\n\nTraceback (most recent call last):\n')
  handler(nil, '  File "x.py"')
  handler(nil, nil)
  eq({
    'WARN 2026-12-01 10:00:00,123 WARNING llama_cpp: a warning',
    'WARN continued',
    'ERROR Traceback (most recent call last):',
    'ERROR   File "x.py"',
  }, logged)
end)

test('completions lose control characters other than tab and newline', function()
  eq('abcdef', ghost.without_control_characters('a\17b\0c\27d\127e\194\133f'))
  eq('if x:\n\treturn 1\n', ghost.without_control_characters('if x:\r\n\treturn 1\n'))
  eq('twothree', ghost.without_control_characters('two\rthree'))
  eq('é ü 中 \194\160 ␑', ghost.without_control_characters('é ü 中 \194\160 ␑'))
end)

test('next word and next line of a suggestion', function()
  eq('total', ghost.next_word('total = add(a, b)'))
  eq(' =', ghost.next_word(' = add(a, b)'))
  eq(' add', ghost.next_word(' add(a, b)'))
  eq('(', ghost.next_word('(a, b)'))
  eq('\n    return', ghost.next_word('\n    return x'))
  eq('total = add(a, b)', ghost.next_line('total = add(a, b)\nprint(total)'))
  eq('\nprint(total)', ghost.next_line('\nprint(total)\nmore'))
  eq('x', ghost.next_line('x'))
end)

test('next_edit and client_name options', function()
  local opts = config.normalize({})
  eq({ enabled = true, debounce_ms = 500, keymaps = { jump_or_apply = '<Tab>', dismiss = '<Esc>' } },
    opts.next_edit)
  eq('quickdraft', opts.client_name)
  opts = config.normalize({ next_edit = { debounce_ms = 0, keymaps = { dismiss = false } } })
  eq({ true, 0, '<Tab>', false }, { opts.next_edit.enabled, opts.next_edit.debounce_ms,
    opts.next_edit.keymaps.jump_or_apply, opts.next_edit.keymaps.dismiss })
  eq('quickdraft_copilot', config.normalize({ client_name = 'quickdraft_copilot' }).client_name)
  for _, bad in ipairs({ { next_edit = { enabled = 'yes' } }, { next_edit = { debounce_ms = -1 } },
    { next_edit = { debounce_ms = 1.5 } }, { next_edit = 'on' }, { client_name = '' },
    { client_name = 'has space' }, { client_name = 3 } }) do
    eq(false, (pcall(config.normalize, bad)))
  end
  -- the tree sent to the server has none of them
  eq(vim.empty_dict(), config.tree(config.normalize({ client_name = 'x', next_edit = { enabled = false } })))
end)

test('next edit stats are kept apart and formatted', function()
  eq(true, stats.is_next_edit({ feature = 'inlineEdit' }))
  eq(false, stats.is_next_edit({ feature = 'inlineCompletion' }))
  eq(false, stats.is_next_edit(nil))
  eq('no next edit yet', stats.format_edit(nil))
  local raw = { feature = 'inlineEdit', latencyMs = 140.4, tokensPerForward = 3.2, editCount = 1,
    tokens = 52, copiedTokens = 40 }
  eq('140 ms · 3.20 tokens per forward · 1 edit (40 of 52 tokens copied)', stats.format_edit(stats.normalize(raw)))
  eq('12 ms · 0 edits · refused: replaced more than half of the region',
    stats.format_edit(stats.normalize({ latencyMs = 12, editCount = 0, tokens = 0,
      rejected = 'replaced more than half of the region' })))
  eq('2 edits', stats.format_edit({ edit_count = 2 }))
  -- A rule's edit: the rule and its confidence, the vetoes that removed other candidates.
  eq('rename 0.90 · 38 ms · 1 edit · vetoed: parse 2, undo 1',
    stats.format_edit(stats.normalize({ latencyMs = 38.2, tokensPerForward = 0, editCount = 1, tokens = 0,
      rule = 'rename', confidence = 0.9, vetoed = { undo = 1, parse = 2, floor = 0 } })))
  eq('4 ms · 0 edits · no edit: no rule candidate survived the vetoes',
    stats.format_edit(stats.normalize({ latencyMs = 4, editCount = 0, tokens = 0,
      abstained = 'no rule candidate survived the vetoes' })))
end)

io.stdout:write(('%d passed, %d failed\n'):format(passed, failed))
os.exit(failed == 0 and 0 or 1)
