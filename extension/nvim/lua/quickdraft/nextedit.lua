-- Next edits: asks the server for `textDocument/copilotInlineEdit` when you pause in Normal mode,
-- on InsertLeave and right after a ghost-text suggestion is accepted, and shows the answer where
-- it applies: the text it removes highlighted (QuickdraftEditDelete), the text it adds as virtual
-- text after it (QuickdraftEditAdd). jump_or_apply() moves the cursor to the edit, and applies
-- it when the cursor is already there; dismiss() hides it; typing hides it.
--
-- An edit belongs to one version of the buffer (the changedtick the client sent the server,
-- vim.lsp.util.buf_versions): one for any other version is never shown nor applied.

local api = vim.api

local M = {}

M.ns = api.nvim_create_namespace('quickdraft.nextedit')

M.METHOD = 'textDocument/copilotInlineEdit'
M.DID_SHOW = 'textDocument/didShowInlineEdit'

--- Counters, for tests and :QuickdraftStatus: requests sent, cancelled ($/cancelRequest of a
--- pending one), answers shown, answers dropped because the buffer moved on, edits applied.
M.counts = { sent = 0, cancelled = 0, shown = 0, stale = 0, applied = 0, empty = 0 }

-- A request is cancelled ($/cancelRequest) only while the client still holds it.
local buffers = require('quickdraft.buffer_requests').new({
  ns = M.ns,
  augroup_prefix = 'quickdraft.nextedit.',
  counts = M.counts,
  cancel_only_pending = true,
})

local options = {
  debounce_ms = 500,
  client_name = 'quickdraft',
  hl_delete = 'QuickdraftEditDelete',
  hl_add = 'QuickdraftEditAdd',
}

--- The version of `bufnr` the LSP client has sent (its changedtick when last changed).
---@param bufnr integer
---@return integer|nil
function M.version(bufnr)
  return vim.lsp.util.buf_versions[bufnr]
end

local function find_client(bufnr)
  for _, client in ipairs(vim.lsp.get_clients({ bufnr = bufnr, name = options.client_name })) do
    local experimental = client.server_capabilities and client.server_capabilities.experimental
    if type(experimental) == 'table' and experimental.inlineEdit == true and not client:is_stopped() then
      return client
    end
  end
  return nil
end

--- Hide the edit shown in `bufnr` (and forget it).
---@param bufnr integer|nil
function M.clear(bufnr)
  buffers:clear(bufnr or api.nvim_get_current_buf())
end

--- The edit shown in `bufnr`, if any: { client_id, version, edits = { {item, range = {sr, sc,
--- er, ec} (bytes, 0-based), text} ... } }.
---@param bufnr integer|nil
---@return table|nil
function M.current(bufnr)
  return buffers:shown(bufnr or api.nvim_get_current_buf())
end

--- Whether the edit shown still belongs to the buffer as it is.
local function still_valid(bufnr, shown)
  return shown ~= nil and api.nvim_buf_is_valid(bufnr) and M.version(bufnr) == shown.version
end

--- Byte column of an LSP position in `bufnr`, nil when it is outside the buffer.
local function byte_col(bufnr, position, encoding)
  if type(position) ~= 'table' or type(position.line) ~= 'number' or type(position.character) ~= 'number' then
    return nil
  end
  local line = api.nvim_buf_get_lines(bufnr, position.line, position.line + 1, false)[1]
  if not line then
    return nil
  end
  local ok, col = pcall(vim.str_byteindex, line, encoding, position.character, false)
  if not ok or col > #line then
    return nil
  end
  return col
end

local function draw(bufnr, shown)
  api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  for _, edit in ipairs(shown.edits) do
    local sr, sc, er, ec = unpack(edit.range)
    if sr ~= er or sc ~= ec then
      api.nvim_buf_set_extmark(bufnr, M.ns, sr, sc, {
        end_row = er,
        end_col = ec,
        hl_group = options.hl_delete,
        hl_mode = 'combine',
      })
    end
    if edit.text ~= '' then
      local lines = vim.split(edit.text, '\n', { plain = true })
      local opts = {
        virt_text = { { lines[1], options.hl_add } },
        virt_text_pos = 'inline',
        hl_mode = 'combine',
      }
      if #lines > 1 then
        local virt_lines = {}
        for i = 2, #lines do
          table.insert(virt_lines, { { lines[i], options.hl_add } })
        end
        opts.virt_lines = virt_lines
      end
      api.nvim_buf_set_extmark(bufnr, M.ns, er, ec, opts)
    end
  end
end

--- The edits of an answer that apply to `bufnr` at `version`, with byte ranges; nil when one
--- of them does not (another document, another version, a range outside the buffer).
local function edits_from(bufnr, client, result, version)
  local items = type(result) == 'table' and result.edits or nil
  if type(items) ~= 'table' or #items == 0 then
    return nil
  end
  local uri = vim.uri_from_bufnr(bufnr)
  local edits = {}
  for _, item in ipairs(items) do
    local doc = type(item) == 'table' and item.textDocument or nil
    if type(doc) ~= 'table' or doc.uri ~= uri or doc.version ~= version or type(item.text) ~= 'string' then
      return nil
    end
    local range = item.range or {}
    local sc = byte_col(bufnr, range.start, client.offset_encoding)
    local ec = byte_col(bufnr, range['end'], client.offset_encoding)
    if not sc or not ec then
      return nil
    end
    table.insert(edits, { item = item, range = { range.start.line, sc, range['end'].line, ec }, text = item.text })
  end
  return edits
end

--- Ask the server now for the next edit at the cursor (nothing when one is shown for the
--- buffer as it is, or when the same question was just answered).
---@param bufnr integer|nil
function M.request(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local s = buffers:state(bufnr)
  buffers:stop_timer(s)
  if bufnr ~= api.nvim_get_current_buf() then
    return
  end
  if still_valid(bufnr, s.shown) then
    return
  end
  local client = find_client(bufnr)
  local version = M.version(bufnr)
  if not client or type(version) ~= 'number' then
    return
  end
  local row = api.nvim_win_get_cursor(0)[1]
  -- The server's answer depends on the text and the region around the cursor's line.
  local asked = { version, row }
  if s.request and vim.deep_equal(s.request.asked, asked) then
    return -- that question is being answered
  end
  if s.answered and vim.deep_equal(s.answered, asked) then
    return -- and that one was answered: nothing new to propose
  end
  buffers:cancel_request(s)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.textDocument.version = version
  local request = buffers:send(s, bufnr, client, M.METHOD, params, function(result)
    s.answered = asked
    local edits = edits_from(bufnr, client, result, version)
    if not edits then
      if type(result) == 'table' and type(result.edits) == 'table' and #result.edits == 0 then
        M.counts.empty = M.counts.empty + 1
      else
        M.counts.stale = M.counts.stale + 1
      end
      return
    end
    if M.version(bufnr) ~= version then
      M.counts.stale = M.counts.stale + 1 -- the buffer changed while the server worked
      return
    end
    M.show(bufnr, { client_id = client.id, version = version, edits = edits })
  end)
  if request then
    request.asked = asked
  end
end

--- Show `shown` (edits for `shown.version` of `bufnr`); nothing when the buffer is at another
--- version. Tells the server (didShowInlineEdit).
---@param bufnr integer
---@param shown table
---@return boolean
function M.show(bufnr, shown)
  if not still_valid(bufnr, shown) then
    M.counts.stale = M.counts.stale + 1
    return false
  end
  buffers:state(bufnr).shown = shown
  draw(bufnr, shown)
  M.counts.shown = M.counts.shown + 1
  local client = vim.lsp.get_client_by_id(shown.client_id)
  if client then
    for _, edit in ipairs(shown.edits) do
      client:notify(M.DID_SHOW, { item = edit.item })
    end
  end
  api.nvim_exec_autocmds('User', { pattern = 'QuickdraftNextEdit', modeline = false })
  return true
end

--- Ask after `debounce_ms` without moves or edits.
---@param bufnr integer|nil
function M.schedule_request(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  buffers:debounce(buffers:state(bufnr), options.debounce_ms, function()
    if api.nvim_get_mode().mode == 'n' then
      M.request(bufnr)
    end
  end)
end

--- The current buffer, and the edit it shows when that is for the buffer as it is (an edit for
--- another version is dropped and counted stale).
---@return integer bufnr
---@return table|nil shown
local function shown_here()
  local bufnr = api.nvim_get_current_buf()
  local shown = buffers:shown(bufnr)
  if shown and not still_valid(bufnr, shown) then
    M.counts.stale = M.counts.stale + 1
    M.clear(bufnr)
    return bufnr, nil
  end
  return bufnr, shown
end

--- Put the cursor at the start of the edit shown, or apply it when the cursor is there.
--- False when no edit (for the buffer as it is) is shown.
---@return boolean
function M.jump_or_apply()
  local _, shown = shown_here()
  if not shown then
    return false
  end
  local first = shown.edits[1].range
  local row, col = unpack(api.nvim_win_get_cursor(0))
  if row - 1 ~= first[1] or col ~= first[2] then
    vim.cmd("normal! m'")
    api.nvim_win_set_cursor(0, { first[1] + 1, first[2] })
    return true
  end
  return M.apply()
end

--- Apply the edit shown (all its parts) as LSP text edits. False when none is shown for the
--- buffer as it is.
---@return boolean
function M.apply()
  local bufnr, shown = shown_here()
  if not shown then
    return false
  end
  local client = vim.lsp.get_client_by_id(shown.client_id)
  if not client then
    M.counts.stale = M.counts.stale + 1
    M.clear(bufnr)
    return false
  end
  M.clear(bufnr)
  local text_edits = {}
  for _, edit in ipairs(shown.edits) do
    table.insert(text_edits, { range = edit.item.range, newText = edit.text })
  end
  vim.lsp.util.apply_text_edits(text_edits, bufnr, client.offset_encoding)
  M.counts.applied = M.counts.applied + 1
  -- The cursor goes to the end of the (last) text put in.
  local last = shown.edits[#shown.edits]
  local lines = vim.split(last.text, '\n', { plain = true })
  local end_row = last.range[1] + #lines - 1
  local end_col = (#lines == 1 and last.range[2] or 0) + #lines[#lines]
  if end_row < api.nvim_buf_line_count(bufnr) then
    pcall(api.nvim_win_set_cursor, 0, { end_row + 1, math.max(end_col - 1, 0) })
  end
  for _, edit in ipairs(shown.edits) do
    if edit.item.command then
      pcall(client.exec_cmd, client, edit.item.command, { bufnr = bufnr })
    end
  end
  return true
end

--- Hide the edit shown; false when none was.
---@return boolean
function M.dismiss()
  return buffers:dismiss(api.nvim_get_current_buf())
end

--- A ghost-text suggestion was accepted in `bufnr`: ask for the edit that follows it.
---@param bufnr integer|nil
function M.after_accept(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  if buffers:watched(bufnr) then
    M.request(bufnr)
  end
end

--- The buffer changed (typing): the edit shown and the question asked are for another version.
local function on_change(bufnr)
  local s = buffers:state(bufnr)
  local version = M.version(bufnr)
  if s.shown and s.shown.version ~= version then
    M.clear(bufnr)
  end
  if s.request and s.request.asked[1] ~= version then
    s.seq = s.seq + 1
    buffers:cancel_request(s)
  end
end

--- QuickdraftEditDelete (linked to DiffDelete) and QuickdraftEditAdd (DiffAdd), unless defined.
function M.set_highlights()
  api.nvim_set_hl(0, 'QuickdraftEditDelete', { link = 'DiffDelete', default = true })
  api.nvim_set_hl(0, 'QuickdraftEditAdd', { link = 'DiffAdd', default = true })
end

--- Start watching `bufnr` (on LspAttach of a server that has next edits).
---@param bufnr integer
---@param opts table { debounce_ms, client_name }
function M.attach(bufnr, opts)
  options.debounce_ms = opts.debounce_ms or options.debounce_ms
  options.client_name = opts.client_name or options.client_name
  buffers:watch(bufnr, {
    { { 'TextChanged' }, function(buf)
      on_change(buf)
      M.schedule_request(buf)
    end },
    { { 'TextChangedI', 'TextChangedP' }, on_change },
    { { 'InsertEnter' }, function(buf)
      buffers:dismiss(buf)
    end },
    { { 'InsertLeave' }, function(buf)
      vim.schedule(function()
        if api.nvim_buf_is_valid(buf) then
          M.request(buf)
        end
      end)
    end },
    { { 'CursorMoved' }, function(buf)
      if not still_valid(buf, buffers:shown(buf)) then
        M.schedule_request(buf)
      end
    end },
    { { 'BufEnter' }, function(buf)
      -- Coming back to a buffer asks once the cursor rests there: an edit made in another
      -- buffer (a function renamed) may call for one here (its import).
      if not still_valid(buf, buffers:shown(buf)) then
        M.schedule_request(buf)
      end
    end },
    { { 'BufLeave' }, function(buf)
      buffers:stop_timer(buffers:state(buf))
    end },
  })
  -- A buffer just opened (attached while it is the current one) asks the same way.
  if bufnr == api.nvim_get_current_buf() then
    M.schedule_request(bufnr)
  end
end

--- Stop watching `bufnr` (on LspDetach).
---@param bufnr integer
function M.detach(bufnr)
  buffers:detach(bufnr)
end

return M
