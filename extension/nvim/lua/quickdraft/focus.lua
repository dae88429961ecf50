-- Tells the server which document the person is looking at, and where, so that it can warm that
-- document's caches before they type: `textDocument/didFocus` (the notification of the Copilot
-- language server) with `{ textDocument = { uri }, position = { line, character } }`; the
-- `position` (the cursor, in the client's negotiated position encoding) is quickdraft's own.
--
-- Sent when an attached buffer gains focus (right after BufEnter / WinEnter, once the command that
-- switched has put the cursor back; not again while the same document keeps it), and `focus_debounce_ms` after the cursor last moved without typing
-- (CursorMoved / CursorMovedI with the same changedtick: a move that comes with a change of the
-- text is an edit, and the server learns of edits from didChange), unless the position is the one
-- sent last. Never for buffers larger than context.max_document_bytes (the server does not
-- complete them).

local api = vim.api

local M = {}

M.METHOD = 'textDocument/didFocus'

local options = {
  debounce_ms = 300,
  max_document_bytes = 2000000,
  client_name = 'quickdraft',
}

---@type table<integer, table> client id -> { uri, line, character }: what it was told last
local last_sent = {}
---@type table<integer, table> bufnr -> { augroup, tick }
local buffers = {}
---@type table|nil { timer, bufnr }: the debounced notification after a cursor move
local pending = nil

local function stop_pending()
  if pending then
    pending.timer:stop()
    pending.timer:close()
    pending = nil
  end
end

local function too_large(bufnr)
  local ok, bytes = pcall(api.nvim_buf_get_offset, bufnr, api.nvim_buf_line_count(bufnr))
  return not ok or bytes > options.max_document_bytes
end

local function usable(client)
  return client and client.name == options.client_name and client.initialized and not client:is_stopped()
end

--- Tell `client` about the cursor of the current window, which shows `bufnr`: always when its
--- document differs from the one `client` was told last; when it is the same, only if
--- `moved` and the position differs.
---@param client vim.lsp.Client
---@param bufnr integer
---@param moved boolean
local function notify(client, bufnr, moved)
  if not usable(client) or bufnr ~= api.nvim_get_current_buf() or too_large(bufnr) then
    return
  end
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  local uri, position = params.textDocument.uri, params.position
  local last = last_sent[client.id]
  if last and last.uri == uri then
    if not moved or (last.line == position.line and last.character == position.character) then
      return
    end
  end
  if client:notify(M.METHOD, params) then
    last_sent[client.id] = { uri = uri, line = position.line, character = position.character }
  end
end

local function attached_clients(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = options.client_name })
end

local function on_enter(bufnr)
  stop_pending()
  local s = buffers[bufnr]
  if s then
    s.tick = api.nvim_buf_get_changedtick(bufnr)
  end
  -- After the command that switched: `:buffer` puts the cursor back where it was only after
  -- BufEnter.
  vim.schedule(function()
    if api.nvim_buf_is_valid(bufnr) and bufnr == api.nvim_get_current_buf() then
      for _, client in ipairs(attached_clients(bufnr)) do
        notify(client, bufnr, false)
      end
    end
  end)
end

local function on_text_changed(bufnr)
  local s = buffers[bufnr]
  if s then
    s.tick = api.nvim_buf_get_changedtick(bufnr) -- a pending move, if any, is dropped when due
  end
end

local function on_cursor_moved(bufnr)
  local s = buffers[bufnr]
  if not s then
    return
  end
  -- The cursor events come before TextChanged(I): a new changedtick here means an edit.
  local tick = api.nvim_buf_get_changedtick(bufnr)
  if tick ~= s.tick then
    s.tick = tick
    stop_pending()
    return
  end
  stop_pending()
  local timer = vim.uv.new_timer()
  pending = { timer = timer, bufnr = bufnr }
  timer:start(options.debounce_ms, 0, function()
    vim.schedule(function()
      if not pending or pending.timer ~= timer then
        return
      end
      stop_pending()
      -- Typed since the move (an edit that did not move the cursor): not a look around.
      if not api.nvim_buf_is_valid(bufnr) or api.nvim_buf_get_changedtick(bufnr) ~= tick then
        return
      end
      for _, client in ipairs(attached_clients(bufnr)) do
        notify(client, bufnr, true)
      end
    end)
  end)
end

--- Take the options (setup() and update()).
---@param opts table { debounce_ms, max_document_bytes, client_name }
function M.configure(opts)
  for key, value in pairs(opts) do
    if options[key] ~= nil and value ~= nil then
      options[key] = value
    end
  end
end

--- Start watching `bufnr` for `client` (on LspAttach), and tell it now when `bufnr` has focus.
---@param client vim.lsp.Client
---@param bufnr integer
function M.attach(client, bufnr)
  if not buffers[bufnr] then
    local augroup = api.nvim_create_augroup('quickdraft.focus.' .. bufnr, { clear = true })
    buffers[bufnr] = { augroup = augroup, tick = api.nvim_buf_get_changedtick(bufnr) }
    local function on(events, callback)
      api.nvim_create_autocmd(events, {
        group = augroup,
        buffer = bufnr,
        callback = function(args)
          callback(args.buf)
        end,
      })
    end
    on({ 'BufEnter', 'WinEnter' }, on_enter)
    on({ 'CursorMoved', 'CursorMovedI' }, on_cursor_moved)
    on({ 'TextChanged', 'TextChangedI', 'TextChangedP' }, on_text_changed)
  end
  -- On the first attach BufEnter came before the client: the buffer may have focus already.
  notify(client, bufnr, false)
end

--- Stop watching `bufnr` (on LspDetach of the last quickdraft client).
---@param bufnr integer
function M.detach(bufnr)
  local s = buffers[bufnr]
  if not s then
    return
  end
  if pending and pending.bufnr == bufnr then
    stop_pending()
  end
  pcall(api.nvim_del_augroup_by_id, s.augroup)
  buffers[bufnr] = nil
end

return M
