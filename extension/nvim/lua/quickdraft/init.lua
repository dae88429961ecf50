-- quickdraft for Neovim: registers `quickdraft serve` with vim.lsp.config / vim.lsp.enable and
-- shows its suggestions as ghost text (native vim.lsp.inline_completion on 0.12+, the plugin's
-- own extmarks on 0.11), with the completion menu from vim.lsp.completion as a fallback.
--
--   require('quickdraft').setup({ model = { preset = 'qwen2.5-coder-1.5b' } })
--
-- See :help quickdraft.

local config = require('quickdraft.config')
local focus = require('quickdraft.focus')
local serverlog = require('quickdraft.serverlog')
local stats = require('quickdraft.stats')
local status = require('quickdraft.status')

local api = vim.api

local M = {}

M.name = 'quickdraft'

---@type table|nil normalized options (nil before setup)
M.options = nil

local totals = stats.new_totals()
local augroup = nil
---@type table<integer, table> client id -> the last `$/quickdraft/status` (normalized)
local server_status = {}
---@type table<integer, table> client id -> { token, value }: the running work-done progress,
--- its reports merged over its begin (a report carries no title)
local progress = {}
local reported_few_tokens_per_forward = false
---@type table|nil the last `$/quickdraft/stats` of a next edit (normalized)
local last_edit = nil

local function has_native_inline()
  return vim.lsp.inline_completion ~= nil and type(vim.lsp.inline_completion.enable) == 'function'
end

--- 'native', 'plugin' or false: how ghost text is shown with the current options and Neovim.
---@return string|false
function M.inline_mode()
  local wanted = M.options and M.options.inline
  if wanted == false then
    return false
  end
  if wanted == 'native' then
    return has_native_inline() and 'native' or 'plugin'
  end
  if wanted == 'plugin' then
    return 'plugin'
  end
  return has_native_inline() and 'native' or 'plugin'
end

--- Statuslines show the state: redraw them, and tell User QuickdraftStatus listeners.
local function status_changed(client_id)
  api.nvim_exec_autocmds('User', {
    pattern = 'QuickdraftStatus',
    modeline = false,
    data = {
      client_id = client_id,
      status = server_status[client_id],
      progress = progress[client_id] and progress[client_id].value,
    },
  })
  pcall(vim.cmd.redrawstatus)
end

local function record_stats(_, result, ctx)
  local normalized = stats.normalize(result)
  if stats.is_next_edit(result) then
    last_edit = normalized
    api.nvim_exec_autocmds('User', { pattern = 'QuickdraftStats', modeline = false, data = result })
    return
  end
  if stats.too_few_tokens_per_forward(normalized) and not reported_few_tokens_per_forward then
    reported_few_tokens_per_forward = true
    vim.lsp.log.warn(('quickdraft: the server reported %s tokens per forward for a computed answer '
      .. '(every forward yields at least one token)'):format(tostring(normalized.tokens_per_forward)))
  end
  stats.add(totals, result)
  if ctx and ctx.client_id then
    M.last_stats_client = ctx.client_id
  end
  api.nvim_exec_autocmds('User', { pattern = 'QuickdraftStats', modeline = false, data = result })
  pcall(vim.cmd.redrawstatus)
end

local function record_status(_, result, ctx)
  local normalized = status.normalize(result)
  if not normalized then
    vim.lsp.log.warn('quickdraft: ignored a $/quickdraft/status without a known state', result)
    return
  end
  server_status[ctx.client_id] = normalized
  status_changed(ctx.client_id)
end

--- LspProgress: keep the latest work-done progress of quickdraft's clients (loading models).
local function record_progress(args)
  local data = args.data or {}
  local client = vim.lsp.get_client_by_id(data.client_id)
  if not client or client.name ~= M.name then
    return
  end
  local params = data.params or {}
  local value = type(params.value) == 'table' and params.value or {}
  local running = progress[client.id]
  if value.kind == 'begin' or (not running and value.kind == 'report') then
    progress[client.id] = { token = params.token, value = value }
  elseif running and running.token == params.token then
    if value.kind == 'end' then
      progress[client.id] = nil
    else
      running.value = vim.tbl_extend('force', running.value, value)
    end
  end
  status_changed(client.id)
end

local function capabilities()
  return vim.tbl_deep_extend('force', vim.lsp.protocol.make_client_capabilities(), {
    textDocument = { inlineCompletion = { dynamicRegistration = false } },
  })
end

--- Neovim 0.11 gives request handlers no `ctx.request_id` (later ones do); plugins that tell
--- a late answer from the current one by it (sidekick.nvim's next edits) drop every answer
--- without it. This client's handlers get it.
local function with_request_ids(client)
  local request = client.request
  client.request = function(...)
    -- `client:request(...)`, or the deprecated `client.request(...)` Neovim still accepts.
    local first = ...
    local method, params, handler, bufnr
    if type(first) == 'table' and getmetatable(first) == getmetatable(client) then
      method, params, handler, bufnr = select(2, ...)
    else
      method, params, handler, bufnr = ...
    end
    if not handler then
      return request(client, method, params, handler, bufnr)
    end
    local id
    local ok
    ok, id = request(client, method, params, function(err, result, ctx, ...)
      if type(ctx) == 'table' and ctx.request_id == nil then
        ctx.request_id = id
      end
      return handler(err, result, ctx, ...)
    end, bufnr)
    return ok, id
  end
end

local function lsp_config(opts)
  local tree = config.tree(opts)
  local cmd = config.cmd(opts)
  return {
    -- Started as vim.lsp.rpc.start() would, but with each stderr line in the LSP log at the
    -- level it carries (Neovim logs them all as errors): see quickdraft.serverlog.
    cmd = function(dispatchers, client_config)
      return serverlog.start(cmd, dispatchers, client_config)
    end,
    filetypes = opts.filetypes,
    root_markers = opts.root_markers,
    init_options = tree,
    -- Sent as workspace/didChangeConfiguration right after initialize, and on update().
    settings = tree,
    capabilities = capabilities(),
    on_init = with_request_ids,
    handlers = {
      ['$/quickdraft/stats'] = record_stats,
      ['$/quickdraft/status'] = record_status,
      -- A server that pulls section "quickdraft" gets the tree itself.
      ['workspace/configuration'] = function(_, params, ctx)
        local client = vim.lsp.get_client_by_id(ctx.client_id)
        local settings = client and client.settings or tree
        local answers = {}
        for _, item in ipairs((params and params.items) or {}) do
          if item.section == nil or item.section == '' or item.section == 'quickdraft' then
            table.insert(answers, settings)
          else
            table.insert(answers, vim.tbl_get(settings, unpack(vim.split(item.section, '.', { plain = true })))
              or vim.NIL)
          end
        end
        return answers
      end,
    },
  }
end

--- The running quickdraft clients.
---@return vim.lsp.Client[]
function M.clients()
  return vim.lsp.get_clients({ name = M.name })
end

local function map(lhs, action, desc)
  if not lhs or lhs == '' then
    return
  end
  vim.keymap.set('i', lhs, function()
    if not action() then
      -- Nothing to accept: the key keeps its built-in meaning. 'i' puts it at the front of the
      -- typeahead, so keys typed after it are still handled after it.
      api.nvim_feedkeys(vim.keycode(lhs), 'ni', false)
    end
  end, { desc = desc, silent = true })
end

local function native_item_suffix(item)
  local text = item.insert_text or item.insertText or item.value
  if type(text) == 'table' then
    text = text.value
  end
  if type(text) ~= 'string' then
    return nil
  end
  local row, col = unpack(api.nvim_win_get_cursor(0))
  row = row - 1
  local start_row, start_col
  local range = item.range
  if type(range) == 'table' then
    if type(range[1]) == 'number' then -- Range4
      start_row, start_col = range[1], range[2]
    elseif type(range.start) == 'table' then -- vim.Range
      start_row, start_col = range.start.row or range.start[1], range.start.col or range.start[2]
    end
  end
  if start_row ~= row or type(start_col) ~= 'number' or start_col > col then
    return text
  end
  local line = api.nvim_get_current_line()
  local typed = line:sub(start_col + 1, col)
  if text:sub(1, #typed) == typed then
    return text:sub(#typed + 1)
  end
  return text
end

--- Accept the whole suggestion; false when none is shown.
---@return boolean
function M.accept()
  local accepted
  if M.inline_mode() == 'native' then
    accepted = vim.lsp.inline_completion.get() == true
  else
    accepted = require('quickdraft.ghost').accept()
  end
  if accepted and M.options.next_edit.enabled then
    -- After the text is in (0.12 applies it on the next loop): the edit that follows it.
    vim.schedule(function()
      vim.schedule(function()
        require('quickdraft.nextedit').after_accept()
      end)
    end)
  end
  return accepted
end

local function accept_part(part_of)
  if M.inline_mode() == 'native' then
    local accepted = vim.lsp.inline_completion.get({
      on_accept = function(item)
        local suffix = native_item_suffix(item)
        if not suffix then
          return
        end
        local part = part_of(suffix)
        local lines = vim.split(part, '\n', { plain = true })
        local row, col = unpack(api.nvim_win_get_cursor(0))
        api.nvim_buf_set_text(0, row - 1, col, row - 1, col, lines)
        api.nvim_win_set_cursor(0, { row + #lines - 1, #lines == 1 and col + #lines[1] or #lines[#lines] })
      end,
    })
    return accepted == true
  end
  local ghost = require('quickdraft.ghost')
  if part_of == ghost.next_word then
    return ghost.accept_word()
  end
  return ghost.accept_line()
end

--- Insert the next word of the suggestion; false when none is shown.
---@return boolean
function M.accept_word()
  return accept_part(require('quickdraft.ghost').next_word)
end

--- Insert the rest of the suggestion's current line; false when none is shown.
---@return boolean
function M.accept_line()
  return accept_part(require('quickdraft.ghost').next_line)
end

--- Show the next (`step` 1) or previous (-1) of the answer's suggestions; false when none is
--- shown. Native inline completion (0.12): `vim.lsp.inline_completion.select()`.
---@param step integer
---@return boolean
local refreshed_at = nil

function M.cycle(step)
  if M.inline_mode() == 'native' then
    -- 0.12 cycles through the items it has. The server answers a place's first request with
    -- one and computes the others after it: the first press here asks again (as a cursor move
    -- does), and that answer holds them all; later presses move through them.
    local row, col = unpack(api.nvim_win_get_cursor(0))
    local place = table.concat({ api.nvim_get_current_buf(), api.nvim_buf_get_changedtick(0), row, col }, ':')
    if refreshed_at ~= place then
      refreshed_at = place
      api.nvim_exec_autocmds('CursorMovedI', { buffer = 0, modeline = false })
      return true
    end
    vim.lsp.inline_completion.select({ count = step })
    return true
  end
  return require('quickdraft.ghost').cycle(step)
end

--- Hide the suggestion; false when none was shown.
---@return boolean
function M.dismiss()
  if M.inline_mode() == 'native' then
    -- 0.12 dismisses on cursor movement; there is no public call to hide it otherwise.
    return false
  end
  return require('quickdraft.ghost').dismiss()
end

--- The suggestion the plugin's ghost text shows (nil with native inline completion).
---@return table|nil
function M.suggestion()
  if M.inline_mode() == 'plugin' then
    return require('quickdraft.ghost').current()
  end
  return nil
end

local function on_attach(args)
  local client = vim.lsp.get_client_by_id(args.data.client_id)
  if not client or client.name ~= M.name then
    return
  end
  local bufnr = args.buf
  local opts = M.options
  if opts.completion.enable and client.server_capabilities.completionProvider then
    vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = opts.completion.autotrigger })
    if opts.completion.omnifunc then
      vim.bo[bufnr].omnifunc = 'v:lua.vim.lsp.omnifunc'
    end
  end
  local mode = M.inline_mode()
  if mode == 'native' then
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
  elseif mode == 'plugin' then
    require('quickdraft.ghost').attach(bufnr, opts)
  end
  focus.attach(client, bufnr)
  local experimental = client.server_capabilities.experimental
  if opts.next_edit.enabled and type(experimental) == 'table' and experimental.inlineEdit == true then
    require('quickdraft.nextedit').attach(bufnr, { debounce_ms = opts.next_edit.debounce_ms, client_name = M.name })
  end
end

local function on_detach(args)
  local client = vim.lsp.get_client_by_id(args.data.client_id)
  if not client or client.name ~= M.name then
    return
  end
  if M.inline_mode() == 'plugin' then
    require('quickdraft.ghost').detach(args.buf)
  end
  local others = vim.tbl_filter(function(other)
    return other.id ~= client.id
  end, vim.lsp.get_clients({ bufnr = args.buf, name = M.name }))
  if #others == 0 then
    focus.detach(args.buf)
    require('quickdraft.nextedit').detach(args.buf)
  end
end

local function configure_focus(opts)
  focus.configure({
    debounce_ms = opts.focus_debounce_ms,
    max_document_bytes = config.max_document_bytes(opts),
    client_name = M.name,
  })
end

local function set_keymaps(keymaps)
  map(keymaps.accept, M.accept, 'quickdraft: accept the suggestion')
  map(keymaps.accept_word, M.accept_word, 'quickdraft: accept the next word')
  map(keymaps.accept_line, M.accept_line, 'quickdraft: accept the next line')
  map(keymaps.dismiss, M.dismiss, 'quickdraft: dismiss the suggestion')
  map(keymaps.next, function()
    return M.cycle(1)
  end, 'quickdraft: show the next suggestion')
  map(keymaps.prev, function()
    return M.cycle(-1)
  end, 'quickdraft: show the previous suggestion')
end

local function map_normal(lhs, action, desc)
  if not lhs or lhs == '' then
    return
  end
  vim.keymap.set('n', lhs, function()
    if not action() then
      api.nvim_feedkeys(vim.keycode(lhs), 'ni', false)
    end
  end, { desc = desc, silent = true })
end

local function set_next_edit_keymaps(next_edit)
  if not next_edit.enabled then
    return
  end
  local nextedit = require('quickdraft.nextedit')
  map_normal(next_edit.keymaps.jump_or_apply, nextedit.jump_or_apply, 'quickdraft: go to the next edit, apply it')
  map_normal(next_edit.keymaps.dismiss, nextedit.dismiss, 'quickdraft: dismiss the next edit')
end

--- Everything :QuickdraftStatus shows, as data. `state` is the server's as a statusline shows
--- it ('inactive' without a server, 'starting', 'loading', 'ready', 'error', 'unavailable',
--- 'stopped'), for the client of the current buffer (else the first); `message` is the server's
--- line about it and `progress` its running work-done progress.
---@return table
function M.status()
  local clients = {}
  local shown, shown_has_buffer = nil, false
  local bufnr = api.nvim_get_current_buf()
  for _, client in ipairs(M.clients()) do
    local client_state = client:is_stopped() and 'stopped' or (client.initialized and 'running' or 'starting')
    local entry = {
      id = client.id,
      state = client_state,
      status = server_status[client.id],
      progress = progress[client.id] and status.progress_text(progress[client.id].value) or nil,
      shown_state = status.resolve(client_state, server_status[client.id], totals.last ~= nil),
      buffers = vim.tbl_keys(client.attached_buffers or {}),
      server = client.server_info,
    }
    table.insert(clients, entry)
    local has_buffer = (client.attached_buffers or {})[bufnr] == true
    if not shown or (has_buffer and not shown_has_buffer) then
      shown, shown_has_buffer = entry, has_buffer
    end
  end
  return {
    configured = M.options ~= nil,
    inline = M.inline_mode(),
    cmd = M.options and config.cmd(M.options) or nil,
    config = M.options and config.tree(M.options) or nil,
    clients = clients,
    state = shown and shown.shown_state or 'inactive',
    message = shown and shown.status and shown.status.message or nil,
    progress = shown and shown.progress or nil,
    backend = shown and shown.status and shown.status.backend or nil,
    last = totals.last,
    last_edit = last_edit,
    totals = vim.deepcopy(totals),
  }
end

--- A short text for 'statusline': `qd … loading: <step>` until the server is ready, `qd ready`,
--- then the last completion's latency and what sped it up (`qd 84 ms · copied 12 of 15 tokens`,
--- `qd 2 ms · cached`, or the latency alone when no draft was tried); `qd ✗ error: ...` /
--- `qd ⚠ unavailable: ...` when it cannot complete; '' without a server.
---@return string
function M.statusline()
  local st = M.status()
  return status.line(st.state, st.message, st.progress, st.last)
end

function M.show_status()
  local st = M.status()
  local lines = {}
  if not st.configured then
    table.insert(lines, 'quickdraft: setup() has not been called')
  else
    if #st.clients == 0 then
      table.insert(lines, 'quickdraft: server not running (no buffer attached)')
    end
    for _, c in ipairs(st.clients) do
      local name = c.server and (c.server.name .. ' ' .. (c.server.version or '')) or 'quickdraft'
      table.insert(lines, ('quickdraft: %s, client %d, %s, buffers %s'):format(
        c.state, c.id, vim.trim(name), table.concat(c.buffers, ' ')))
    end
    local state = st.state .. (st.message and st.message ~= '' and (': ' .. st.message) or '')
    if st.backend == 'openai' then
      state = state .. ' [remote engine]'
    end
    table.insert(lines, 'state: ' .. state)
    if st.progress then
      table.insert(lines, 'progress: ' .. st.progress)
    end
    table.insert(lines, 'command: ' .. table.concat(st.cmd, ' '))
    table.insert(lines, 'ghost text: ' .. tostring(st.inline))
    table.insert(lines, 'last: ' .. stats.format(st.last))
    local details = stats.details(st.last)
    if details then
      table.insert(lines, '      ' .. details)
    end
    table.insert(lines, 'session: ' .. stats.format_totals(st.totals))
    if M.options.next_edit.enabled then
      table.insert(lines, 'next edit: ' .. stats.format_edit(st.last_edit))
    end
  end
  vim.notify(table.concat(lines, '\n'), vim.log.levels.INFO)
  return lines
end

--- Restart the server(s) with the current options.
function M.restart()
  vim.lsp.enable(M.name, false)
  vim.wait(5000, function()
    return #M.clients() == 0
  end, 20)
  totals = stats.new_totals()
  last_edit = nil
  server_status, progress = {}, {}
  vim.lsp.enable(M.name, true)
end

--- Change options at run time. Model or command changes restart the server; the rest is sent
--- as workspace/didChangeConfiguration.
---@param opts table options as for setup()
function M.update(opts)
  assert(M.options, 'quickdraft: call setup() first')
  local before_cmd = config.cmd(M.options)
  M.options = config.normalize(vim.tbl_deep_extend('force', M.options, opts or {}))
  configure_focus(M.options)
  vim.lsp.config(M.name, lsp_config(M.options))
  if not vim.deep_equal(before_cmd, config.cmd(M.options)) then
    M.restart()
    return
  end
  local tree = config.tree(M.options)
  for _, client in ipairs(M.clients()) do
    client.settings = tree
    client:notify('workspace/didChangeConfiguration', { settings = tree })
  end
end

---@param opts table|nil see :help quickdraft-setup
function M.setup(opts)
  if vim.fn.has('nvim-0.11') ~= 1 then
    vim.notify('quickdraft needs Neovim 0.11 or newer', vim.log.levels.ERROR)
    return
  end
  M.options = config.normalize(opts)
  M.name = M.options.client_name
  configure_focus(M.options)

  augroup = api.nvim_create_augroup('quickdraft', { clear = true })
  require('quickdraft.highlight').setup(augroup)
  local nextedit = require('quickdraft.nextedit')
  nextedit.set_highlights()
  api.nvim_create_autocmd('ColorScheme', { group = augroup, callback = nextedit.set_highlights })
  api.nvim_create_autocmd('LspAttach', { group = augroup, callback = on_attach })
  api.nvim_create_autocmd('LspDetach', { group = augroup, callback = on_detach })
  api.nvim_create_autocmd('LspProgress', { group = augroup, callback = record_progress })

  set_keymaps(M.options.keymaps)
  set_next_edit_keymaps(M.options.next_edit)

  api.nvim_create_user_command('QuickdraftStatus', function()
    M.show_status()
  end, { desc = 'quickdraft: server state and the last completion stats' })
  api.nvim_create_user_command('QuickdraftRestart', function()
    M.restart()
  end, { desc = 'quickdraft: restart the server' })
  api.nvim_create_user_command('QuickdraftLog', function()
    vim.cmd.split(vim.lsp.log.get_filename())
  end, { desc = 'quickdraft: open the LSP log' })

  vim.lsp.config(M.name, lsp_config(M.options))
  vim.lsp.enable(M.name)
end

return M
