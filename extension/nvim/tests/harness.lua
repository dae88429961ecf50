-- A tiny driver for end-to-end scenarios in a real (headless) Neovim.
--
-- A scenario runs in a coroutine; between its steps the editor's main loop runs, so keys queued
-- with nvim_input() are handled exactly as typed ones (Insert mode, TextChangedI, mappings) and
-- LSP messages arrive. Results go to $QD_RESULT as JSON: { checks = [...], failures = [...],
-- data = {...} }, then Neovim quits (exit code 0 when every check passed).

local H = {}

H.checks = {}
H.failures = {}
H.data = {}

local function note(line)
  io.stderr:write('[e2e] ' .. line .. '\n')
end
H.note = note

--- Let the editor run for `ms` milliseconds.
function H.sleep(ms)
  local co = coroutine.running()
  vim.defer_fn(function()
    local ok, err = coroutine.resume(co)
    if not ok then
      H.finish('error: ' .. tostring(err))
    end
  end, ms)
  coroutine.yield()
end

--- Wait until `cond()` returns a truthy value (returned), or nil after `timeout_ms`.
function H.wait(cond, timeout_ms, interval)
  local deadline = vim.uv.now() + timeout_ms
  while true do
    local ok, value = pcall(cond)
    if ok and value then
      return value
    end
    if vim.uv.now() >= deadline then
      return nil
    end
    H.sleep(interval or 25)
  end
end

--- Queue keys as if typed (key notation, e.g. "<Esc>").
function H.type(keys)
  vim.api.nvim_input(keys)
  H.sleep(20)
end

--- Record a check; `detail` is kept with it for the report.
function H.check(name, ok, detail)
  table.insert(H.checks, { name = name, ok = ok and true or false, detail = detail })
  if not ok then
    table.insert(H.failures, name .. (detail ~= nil and (': ' .. vim.inspect(detail)) or ''))
    note('FAIL ' .. name .. (detail ~= nil and (': ' .. vim.inspect(detail)) or ''))
  else
    note('ok   ' .. name)
  end
  return ok
end

function H.eq(name, expected, actual)
  return H.check(name, vim.deep_equal(expected, actual), { expected = expected, actual = actual })
end

local finished = false

--- Write the results and quit.
function H.finish(err)
  if finished then
    return
  end
  finished = true
  if err then
    table.insert(H.failures, err)
    note(err)
  end
  local result = { checks = H.checks, failures = H.failures, data = H.data }
  local path = os.getenv('QD_RESULT')
  if path then
    local file = assert(io.open(path, 'w'))
    file:write(vim.json.encode(result))
    file:close()
  end
  vim.schedule(function()
    vim.cmd((#H.failures == 0) and 'qall!' or 'cquit!')
  end)
end

--- Run `scenario` in a coroutine; any error fails the run.
function H.run(scenario)
  local co = coroutine.create(function()
    local ok, err = xpcall(scenario, debug.traceback)
    H.finish(not ok and ('error: ' .. tostring(err)) or nil)
  end)
  vim.schedule(function()
    local ok, err = coroutine.resume(co)
    if not ok then
      H.finish('error: ' .. tostring(err))
    end
  end)
end

--- The lines of the current buffer as one string.
function H.text(bufnr)
  return table.concat(vim.api.nvim_buf_get_lines(bufnr or 0, 0, -1, false), '\n')
end

--- The ghost text extmarks of the plugin in `bufnr`: { {row, col, virt_text, virt_lines}... }.
function H.ghost_marks(bufnr)
  local ns = vim.api.nvim_get_namespaces()['quickdraft.ghost']
  local out = {}
  if not ns then
    return out
  end
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(bufnr or 0, ns, 0, -1, { details = true })) do
    local details = mark[4]
    local text = {}
    for _, chunk in ipairs(details.virt_text or {}) do
      table.insert(text, chunk[1])
    end
    local lines = {}
    for _, line in ipairs(details.virt_lines or {}) do
      local parts = {}
      for _, chunk in ipairs(line) do
        table.insert(parts, chunk[1])
      end
      table.insert(lines, table.concat(parts))
    end
    table.insert(out, {
      row = mark[2],
      col = mark[3],
      virt_text = table.concat(text),
      virt_lines = lines,
      pos = details.virt_text_pos,
      hl = details.virt_text and details.virt_text[1] and details.virt_text[1][2],
    })
  end
  return out
end

--- The ghost text as the text it stands for (virt_text, then each virt_line after a newline).
function H.ghost_text(bufnr)
  local marks = H.ghost_marks(bufnr)
  if #marks == 0 then
    return nil
  end
  local mark = marks[1]
  local parts = { mark.virt_text }
  for _, line in ipairs(mark.virt_lines) do
    table.insert(parts, line)
  end
  return table.concat(parts, '\n')
end

function H.mode()
  return vim.api.nvim_get_mode().mode
end

--- The first quickdraft client once it is initialized and attached to the current buffer; nil
--- after `timeout_ms` (polling every `interval` ms, see H.wait).
function H.attached_client(timeout_ms, interval)
  local quickdraft = require('quickdraft')
  return H.wait(function()
    local c = quickdraft.clients()[1]
    return c and c.initialized and c.attached_buffers[vim.api.nvim_get_current_buf()] and c
  end, timeout_ms, interval)
end

--- What the scripted server (tests/fake_server.py) logged to $QD_FAKE_LOG as events of `kind`:
--- their data, in order (vim.NIL for an event without data).
function H.fake_log_events(kind)
  local out = {}
  local file = io.open(os.getenv('QD_FAKE_LOG'), 'r')
  if not file then
    return out
  end
  for line in file:lines() do
    local entry = vim.json.decode(line, { luanil = { object = true, array = true } })
    if entry.event == kind then
      table.insert(out, entry.data == nil and vim.NIL or entry.data)
    end
  end
  file:close()
  return out
end

--- The messages the server sends as window/logMessage from now on, in a list that fills as they
--- come (they still go to the default handler).
function H.log_messages()
  local logged = {}
  local default_log = vim.lsp.handlers['window/logMessage']
  vim.lsp.handlers['window/logMessage'] = function(err, params, ctx)
    table.insert(logged, params and params.message or '')
    return default_log(err, params, ctx)
  end
  return logged
end

--- `text` with the LSP text edits `items` ({range, text}: the server's answer) applied, in a
--- scratch buffer by Neovim's own apply_text_edits: what the buffer must read after a client
--- applies exactly those edits, whatever model wrote them.
function H.with_edits(text, items)
  local scratch = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_lines(scratch, 0, -1, false, vim.split(text, '\n', { plain = true }))
  local edits = vim.tbl_map(function(item)
    return { range = item.range, newText = item.text }
  end, items)
  vim.lsp.util.apply_text_edits(edits, scratch, 'utf-16')
  local out = H.text(scratch)
  vim.api.nvim_buf_delete(scratch, { force = true })
  return out
end

--- The contents of the file at `path`.
function H.text_on_disk(path)
  local file = assert(io.open(path, 'r'))
  local text = file:read('*a')
  file:close()
  return text
end

--- The plugin set up for next edits only (the server: $QD_CMD, a JSON list; a short rest);
--- returns its next-edit module.
function H.setup_next_edits()
  require('quickdraft').setup({
    cmd = vim.json.decode(os.getenv('QD_CMD')),
    inline = 'plugin',
    completion = { enable = false },
    next_edit = { debounce_ms = 150 },
  })
  return require('quickdraft.nextedit')
end

--- Wait for a next edit other than `previous` to be drawn in the current buffer (`nextedit`:
--- the plugin's module); <Tab> to it and <Tab> to apply it, checking both, under `label`
--- (H.data[label]: its range, text and document). Returns what was shown (nil when none came).
function H.tab_tab(nextedit, label, previous)
  local api = vim.api
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
  H.data[label] = { range = first.item.range, text = first.text, uri = first.item.textDocument.uri }
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

return H
