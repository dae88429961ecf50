-- Options of require("quickdraft").setup() -> the server command and quickdraft's config tree.
--
-- Pure functions (no editor state), unit-tested by tests/config_spec.lua.
-- The tree has the shape of server/quickdraft/config.py with snake_case keys:
--   { model = {...}, decoding = {...}, context = {...}, cache = {...}, edits = {...},
--     languages = { [id] = {...} } }
-- Options left unset are omitted, so they never override the server's own defaults or the flags
-- on its command line. The server validates the values.

local M = {}

M.defaults = {
  -- The server: `{server_path} serve [model flags] {server_args...}`; `cmd` (a list) overrides it.
  server_path = 'quickdraft',
  server_args = {},
  cmd = nil,
  -- The config tree sections (keys in snake_case or camelCase).
  model = {},
  decoding = {},
  context = {},
  cache = {},
  edits = {},
  languages = {},
  -- Filetypes to attach to; nil attaches to every buffer that is a file.
  filetypes = nil,
  root_markers = { '.git' },
  -- Ghost text: 'auto' (native vim.lsp.inline_completion on 0.12+, else the plugin's own),
  -- 'native', 'plugin', or false (none; only the completion menu).
  inline = 'auto',
  -- Quiet time (ms) after the last keystroke before the plugin's ghost text asks the server
  -- (0.11 path); a keystroke within it cancels the request in flight and starts the wait again.
  debounce_ms = 75,
  -- Quiet time (ms) after the cursor last moved without typing before the server is told where
  -- it is (textDocument/didFocus, so it can warm that document's caches before the next
  -- keystroke); a buffer gaining focus tells it at once.
  focus_debounce_ms = 300,
  -- vim.lsp.completion for textDocument/completion (the menu). `omnifunc`: make <C-x><C-o> ask
  -- the language servers (vim.lsp.omnifunc) even where a filetype plugin set another omnifunc.
  completion = { enable = true, autotrigger = false, omnifunc = true },
  -- Insert-mode keys; false disables one. Each falls back to the key's own meaning when no
  -- suggestion is shown.
  keymaps = {
    accept = '<Tab>',
    accept_word = '<M-Right>',
    accept_line = '<M-Down>',
    dismiss = '<C-]>',
    -- The next / previous of the server's suggestions for this place (it sends up to
    -- `decoding.candidates`); " (i/n)" says which is shown.
    next = '<M-]>',
    prev = '<M-[>',
  },
  hl_group = 'QuickdraftSuggestion',
  -- The LSP client's name. Plugins that look for a next-edit server by name (sidekick.nvim looks
  -- for one whose name contains "copilot") find quickdraft under e.g. 'quickdraft_copilot'.
  client_name = 'quickdraft',
  -- Next edits (textDocument/copilotInlineEdit), where the server offers them: asked
  -- `debounce_ms` after the cursor last moved in Normal mode, on InsertLeave and after a
  -- suggestion is accepted. Normal-mode keys (false disables one; each falls back to the key's
  -- own meaning when no edit is shown): `jump_or_apply` moves to the edit, pressed there applies
  -- it; `dismiss` hides it. `enabled = false` where another plugin (sidekick.nvim) shows them.
  next_edit = {
    enabled = true,
    debounce_ms = 500,
    keymaps = { jump_or_apply = '<Tab>', dismiss = '<Esc>' },
  },
}

--- setup() options whose default is nil (so not in M.defaults): known all the same.
M.OPTIONAL = { cmd = true, filetypes = true }

--- The longest `debounce_ms` accepted (more would feel like no completion at all).
M.MAX_DEBOUNCE_MS = 2000

--- The longest `focus_debounce_ms` accepted.
M.MAX_FOCUS_DEBOUNCE_MS = 10000

--- The server's default context.max_document_bytes: larger documents are not completed.
M.SERVER_MAX_DOCUMENT_BYTES = 2000000

--- `maxNewTokens` -> `max_new_tokens` (the rule of config.py's `_snake`).
---@param key string
---@return string
function M.to_snake(key)
  local out = key:sub(1, 1) .. key:sub(2):gsub('(%u)', '_%1')
  return (out:lower():gsub('-', '_'))
end

local function is_set(value)
  return value ~= nil and value ~= vim.NIL and not (type(value) == 'string' and vim.trim(value) == '')
end

local function snake_table(tbl)
  local out = {}
  for key, value in pairs(tbl or {}) do
    if type(key) == 'string' and is_set(value) then
      out[M.to_snake(key)] = type(value) == 'string' and vim.trim(value) or value
    end
  end
  return out
end

--- Merge user options over the defaults and check their types.
---@param opts table|nil
---@return table
function M.normalize(opts)
  opts = opts or {}
  vim.validate('opts', opts, 'table')
  local unknown = {}
  for key in pairs(opts) do
    if M.defaults[key] == nil and not M.OPTIONAL[key] then
      table.insert(unknown, tostring(key))
    end
  end
  if #unknown > 0 then
    table.sort(unknown)
    error(('quickdraft: unknown setup option%s: %s'):format(#unknown > 1 and 's' or '', table.concat(unknown, ', ')))
  end
  local merged = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts)
  -- Lists replace, never merge element-wise.
  for _, key in ipairs({ 'server_args', 'cmd', 'filetypes', 'root_markers' }) do
    if opts[key] ~= nil then
      merged[key] = opts[key]
    end
  end
  vim.validate('server_path', merged.server_path, 'string')
  vim.validate('server_args', merged.server_args, 'table')
  vim.validate('cmd', merged.cmd, 'table', true)
  vim.validate('model', merged.model, 'table')
  vim.validate('decoding', merged.decoding, 'table')
  vim.validate('context', merged.context, 'table')
  vim.validate('cache', merged.cache, 'table')
  vim.validate('edits', merged.edits, 'table')
  vim.validate('languages', merged.languages, 'table')
  vim.validate('filetypes', merged.filetypes, 'table', true)
  vim.validate('debounce_ms', merged.debounce_ms, function(value)
    return type(value) == 'number' and value >= 0 and value <= M.MAX_DEBOUNCE_MS and value % 1 == 0
  end, ('a whole number of milliseconds from 0 to %d'):format(M.MAX_DEBOUNCE_MS))
  vim.validate('focus_debounce_ms', merged.focus_debounce_ms, function(value)
    return type(value) == 'number' and value >= 0 and value <= M.MAX_FOCUS_DEBOUNCE_MS and value % 1 == 0
  end, ('a whole number of milliseconds from 0 to %d'):format(M.MAX_FOCUS_DEBOUNCE_MS))
  vim.validate('keymaps', merged.keymaps, 'table')
  vim.validate('client_name', merged.client_name, function(value)
    return type(value) == 'string' and value:match('^[%w_.-]+$') ~= nil
  end, 'a name of letters, digits, _ . -')
  vim.validate('next_edit', merged.next_edit, 'table')
  vim.validate('next_edit.enabled', merged.next_edit.enabled, 'boolean')
  vim.validate('next_edit.debounce_ms', merged.next_edit.debounce_ms, function(value)
    return type(value) == 'number' and value >= 0 and value <= M.MAX_FOCUS_DEBOUNCE_MS and value % 1 == 0
  end, ('a whole number of milliseconds from 0 to %d'):format(M.MAX_FOCUS_DEBOUNCE_MS))
  vim.validate('next_edit.keymaps', merged.next_edit.keymaps, 'table')
  if not vim.tbl_contains({ 'auto', 'native', 'plugin', false }, merged.inline) then
    error(("quickdraft: inline must be 'auto', 'native', 'plugin' or false, got %s"):format(
      vim.inspect(merged.inline)
    ))
  end
  return merged
end

--- The configuration tree sent as initializationOptions and workspace/didChangeConfiguration.
---@param opts table normalized options
---@return table
function M.tree(opts)
  local tree = {}
  for _, section in ipairs({ 'model', 'decoding', 'context', 'cache', 'edits' }) do
    local values = snake_table(opts[section])
    if section == 'model' and type(values.draft) == 'string' and values.draft:lower() == 'none' then
      values.draft = vim.NIL -- n-gram drafting only
    end
    if next(values) then
      tree[section] = values
    end
  end
  local languages = {}
  for id, settings in pairs(opts.languages or {}) do
    if type(settings) == 'table' then
      languages[id] = snake_table(settings)
    end
  end
  if next(languages) then
    tree.languages = languages
  end
  -- An empty tree is still an object: vim.json would send an empty table as `[]`.
  return next(tree) and tree or vim.empty_dict()
end

--- The command that starts the server.
---@param opts table normalized options
---@return string[]
function M.cmd(opts)
  if opts.cmd then
    return vim.deepcopy(opts.cmd)
  end
  local cmd = { opts.server_path, 'serve' }
  local model = M.tree(opts).model or {}
  for _, flag in ipairs({ 'preset', 'target', 'draft', 'device', 'runtime', 'dtype' }) do
    local value = model[flag]
    if value ~= nil then
      vim.list_extend(cmd, { '--' .. flag, value == vim.NIL and 'none' or tostring(value) })
    end
  end
  if model.calibrate == false then
    table.insert(cmd, '--no-calibrate')
  end
  for _, arg in ipairs(opts.server_args) do
    table.insert(cmd, tostring(arg))
  end
  return cmd
end

--- The size (UTF-8 bytes) above which the server does not complete a document: the options'
--- context.max_document_bytes, else the server's default.
---@param opts table normalized options
---@return integer
function M.max_document_bytes(opts)
  local value = tonumber((M.tree(opts).context or {}).max_document_bytes)
  return (value and value >= 1) and value or M.SERVER_MAX_DOCUMENT_BYTES
end

--- Whether a language is switched off in the options (the server also knows it).
---@param opts table
---@param language_id string
---@return boolean
function M.language_enabled(opts, language_id)
  local settings = (opts.languages or {})[language_id]
  return not (type(settings) == 'table' and settings.enabled == false)
end

return M
