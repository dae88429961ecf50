-- Ghost text for Neovim 0.11 (which has no vim.lsp.inline_completion): asks the server for
-- `textDocument/inlineCompletion` a moment after the last keystroke in Insert mode and draws the
-- first item with extmarks (the rest of the current line inline, further lines below).
--
-- Typing characters that match the suggestion keeps it (shortened); anything else drops it and
-- asks again. accept() applies the whole item, accept_word()/accept_line() insert a part of it
-- and keep showing the rest. cycle(1) / cycle(-1) show the next / previous item of the answer
-- (" (i/n)" after it); with one item, they first ask again as an explicit request
-- (triggerKind Invoked), which the server answers with all its candidates.

local api = vim.api

local M = {}

M.ns = api.nvim_create_namespace('quickdraft.ghost')

--- How many answers were taken (shown or empty) since startup; for tests and statuslines.
M.answered = 0

--- Requests sent, and those cancelled with `$/cancelRequest` because a keystroke (or leaving
--- Insert mode) superseded them before their answer came.
M.requests = { sent = 0, cancelled = 0 }

local buffers = require('quickdraft.buffer_requests').new({
  ns = M.ns,
  augroup_prefix = 'quickdraft.ghost.',
  counts = M.requests,
})

local options = {
  debounce_ms = 75,
  counter_hl_group = 'Comment',
  hl_group = 'QuickdraftSuggestion',
  client_name = 'quickdraft',
}

local function cursor()
  local pos = api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

local function in_insert_mode()
  local mode = api.nvim_get_mode().mode
  return mode:sub(1, 1) == 'i'
end

local function find_client(bufnr)
  for _, client in ipairs(vim.lsp.get_clients({ bufnr = bufnr, name = options.client_name })) do
    if client.server_capabilities and client.server_capabilities.inlineCompletionProvider then
      return client
    end
  end
  return nil
end

--- `text` without control characters other than tab and newline (CRLF becomes LF). A model,
--- above all a small or random one, can emit bytes such as U+0011; the server filters them too,
--- this is the editor's own defence.
---@param text string
---@return string
function M.without_control_characters(text)
  text = text:gsub('\r\n', '\n')
  text = text:gsub('[%z\1-\8\11-\31\127]', '') -- C0 but tab (9) and newline (10), and DEL
  text = text:gsub('\194[\128-\159]', '') -- the C1 controls U+0080..U+009F in UTF-8
  return text
end

--- The plain text of an InlineCompletionItem's insertText (string or StringValue snippet).
local function item_text(item)
  local text = item.insertText
  if type(text) == 'table' then
    text = text.value or ''
    local ok, grammar = pcall(require, 'vim.lsp._snippet_grammar')
    if ok then
      local parsed_ok, parsed = pcall(grammar.parse, text)
      if parsed_ok then
        return tostring(parsed), true
      end
    end
    return text, true
  end
  return type(text) == 'string' and text or '', false
end

--- Byte column of an LSP position on `row` of `bufnr`.
local function byte_col(bufnr, position, encoding)
  local line = api.nvim_buf_get_lines(bufnr, position.line, position.line + 1, false)[1] or ''
  local ok, col = pcall(vim.str_byteindex, line, encoding, position.character, false)
  if not ok then
    return #line
  end
  return math.min(col, #line)
end

--- Hide the suggestion (and forget it).
---@param bufnr integer|nil
function M.clear(bufnr)
  buffers:clear(bufnr or api.nvim_get_current_buf())
end

local function draw(bufnr, suggestion)
  api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  local lines = vim.split(suggestion.text, '\n', { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    table.insert(virt_lines, { { lines[i], options.hl_group } })
  end
  local first = { { lines[1], options.hl_group } }
  if suggestion.count and suggestion.count > 1 then
    -- Which of the answer's items this is, as Neovim 0.12 shows it.
    table.insert(first, { (' (%d/%d)'):format(suggestion.index, suggestion.count), options.counter_hl_group })
  end
  local opts = {
    virt_text = first,
    virt_text_pos = 'inline',
    hl_mode = 'combine',
    right_gravity = false,
  }
  if #virt_lines > 0 then
    opts.virt_lines = virt_lines
  end
  suggestion.extmark = api.nvim_buf_set_extmark(bufnr, M.ns, suggestion.row, suggestion.col, opts)
end

--- The suggestion shown in `bufnr`, if any: { text = <what accept inserts at the cursor>, ... }.
---@param bufnr integer|nil
---@return table|nil
function M.current(bufnr)
  return buffers:shown(bufnr or api.nvim_get_current_buf())
end

--- Whether a suggestion is shown in the current buffer.
---@return boolean
function M.visible()
  return M.current() ~= nil
end

--- The usable items of a response, as suggestions anchored at the cursor, in order.
local function suggestions_from(bufnr, client, result, row, col)
  local found = {}
  local items = result and (result.items or result) or {}
  if type(items) ~= 'table' then
    return found
  end
  local line = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  for _, item in ipairs(items) do
    local text, is_snippet = item_text(item)
    text = M.without_control_characters(text)
    local range = nil
    local typed = ''
    if item.range then
      local sr, er = item.range.start.line, item.range['end'].line
      local sc = byte_col(bufnr, item.range.start, client.offset_encoding)
      local ec = byte_col(bufnr, item.range['end'], client.offset_encoding)
      -- Only ranges that start on the cursor line, at or before the cursor, can be shown as
      -- text after the cursor.
      if sr == row and sc <= col and (er > row or ec >= col) then
        range = { sr, sc, er, ec }
        typed = line:sub(sc + 1, col)
      else
        text = nil
      end
    end
    if text and text:sub(1, #typed) == typed and #text > #typed then
      found[#found + 1] = {
        client_id = client.id,
        item = item,
        snippet = is_snippet,
        range = range, -- what a whole accept replaces (nil: insert at the cursor)
        full_text = text,
        text = text:sub(#typed + 1), -- the ghost: what is added at the cursor
        row = row,
        col = col,
        tick = api.nvim_buf_get_changedtick(bufnr),
      }
    end
  end
  for index, suggestion in ipairs(found) do
    suggestion.index, suggestion.count = index, #found
  end
  return found
end

local function show(bufnr, s, suggestion)
  s.shown = suggestion
  if suggestion then
    draw(bufnr, suggestion)
  else
    api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  end
  api.nvim_exec_autocmds('User', { pattern = 'QuickdraftSuggestion', modeline = false })
end

--- Ask the server now for a suggestion at the cursor.
---@param bufnr integer|nil
---@param trigger_kind integer|nil 1 invoked, 2 automatic (default)
---@param step integer|nil show the item this many after the first (cycle() asking again)
function M.request(bufnr, trigger_kind, step)
  bufnr = bufnr or api.nvim_get_current_buf()
  local s = buffers:state(bufnr)
  buffers:cancel_request(s)
  local client = find_client(bufnr)
  if not client or bufnr ~= api.nvim_get_current_buf() or not in_insert_mode() then
    return
  end
  local row, col = cursor()
  local tick = api.nvim_buf_get_changedtick(bufnr)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = trigger_kind or 2 }
  buffers:send(s, bufnr, client, 'textDocument/inlineCompletion', params, function(result)
    -- Drop answers to a question that no longer stands.
    if bufnr ~= api.nvim_get_current_buf() or not in_insert_mode() then
      return
    end
    local now_row, now_col = cursor()
    if now_row ~= row or now_col ~= col or api.nvim_buf_get_changedtick(bufnr) ~= tick then
      return
    end
    M.answered = M.answered + 1
    local found = suggestions_from(bufnr, client, result, row, col)
    s.choices = found
    local index = #found > 0 and ((step or 0) % #found) + 1 or 1
    show(bufnr, s, found[index])
  end)
end

--- Show the item `step` after the one shown (negative: before it), wrapping around. With one
--- item, asks the server again first (an explicit request gets all its candidates). Returns
--- false when no suggestion is shown.
---@param step integer
---@return boolean
function M.cycle(step)
  local bufnr = api.nvim_get_current_buf()
  local s = buffers:state(bufnr)
  local suggestion = s.shown
  if not suggestion then
    return false
  end
  local choices = s.choices or { suggestion }
  if #choices < 2 then
    if not suggestion.asked then
      suggestion.asked = true -- once: the server has no more for this place otherwise
      M.request(bufnr, 1, step)
    end
    return true
  end
  local index = ((suggestion.index - 1 + step) % #choices) + 1
  show(bufnr, s, choices[index])
  return true
end

--- Ask after `debounce_ms` without keystrokes.
---@param bufnr integer|nil
function M.schedule_request(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local s = buffers:state(bufnr)
  buffers:supersede(s) -- any answer in flight is stale from now on
  buffers:debounce(s, options.debounce_ms, function()
    M.request(bufnr)
  end)
end

--- TextChangedI / CursorMovedI: keep a suggestion the user is typing through, else ask again.
---@param bufnr integer
function M.on_change(bufnr)
  local suggestion = buffers:shown(bufnr)
  local row, col = cursor()
  local tick = api.nvim_buf_get_changedtick(bufnr)
  if suggestion then
    if row == suggestion.row and col == suggestion.col and tick == suggestion.tick then
      return -- nothing changed since it was drawn (the other of the two events)
    end
    if row == suggestion.row and col > suggestion.col then
      local line = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
      local typed = line:sub(suggestion.col + 1, col)
      if #typed < #suggestion.text and suggestion.text:sub(1, #typed) == typed then
        buffers:state(bufnr).choices = { suggestion } -- the others do not go on from here
        suggestion.count = 1
        suggestion.text = suggestion.text:sub(#typed + 1)
        suggestion.col = col
        suggestion.tick = tick
        suggestion.range = nil
        draw(bufnr, suggestion)
        return
      end
    end
    M.clear(bufnr)
  end
  M.schedule_request(bufnr)
end

--- Insert `text` at the cursor and move the cursor after it.
local function insert_at_cursor(bufnr, text)
  local row, col = cursor()
  local lines = vim.split(text, '\n', { plain = true })
  api.nvim_buf_set_text(bufnr, row, col, row, col, lines)
  local end_row = row + #lines - 1
  local end_col = #lines == 1 and col + #lines[1] or #lines[#lines]
  api.nvim_win_set_cursor(0, { end_row + 1, end_col })
  return end_row, end_col
end

local function run_command(suggestion, bufnr)
  local command = suggestion.item and suggestion.item.command
  if command then
    local client = vim.lsp.get_client_by_id(suggestion.client_id)
    if client then
      pcall(function()
        client:exec_cmd(command, { bufnr = bufnr })
      end)
    end
  end
end

--- Apply the whole suggestion. Returns false when none is shown.
---@return boolean
function M.accept()
  local bufnr = api.nvim_get_current_buf()
  local s = buffers:state(bufnr)
  local suggestion = s.shown
  if not suggestion then
    return false
  end
  M.clear(bufnr)
  buffers:stop_timer(s)
  s.seq = s.seq + 1
  if suggestion.snippet then
    -- Remove what the snippet replaces, then let vim.snippet expand it at the cursor.
    if suggestion.range then
      local r = suggestion.range
      api.nvim_buf_set_text(bufnr, r[1], r[2], r[3], r[4], { '' })
      api.nvim_win_set_cursor(0, { r[1] + 1, r[2] })
    end
    local raw = suggestion.item.insertText
    vim.snippet.expand(M.without_control_characters(type(raw) == 'table' and raw.value or suggestion.full_text))
  elseif suggestion.range then
    local r = suggestion.range
    local lines = vim.split(suggestion.full_text, '\n', { plain = true })
    api.nvim_buf_set_text(bufnr, r[1], r[2], r[3], r[4], lines)
    local end_row = r[1] + #lines - 1
    local end_col = #lines == 1 and r[2] + #lines[1] or #lines[#lines]
    api.nvim_win_set_cursor(0, { end_row + 1, end_col })
  else
    insert_at_cursor(bufnr, suggestion.text)
  end
  run_command(suggestion, bufnr)
  return true
end

--- The next word of `text` (with the whitespace and line break before it).
---@param text string
---@return string
function M.next_word(text)
  local lead = text:match('^%s*') or ''
  local rest = text:sub(#lead + 1)
  local word = rest:match('^[%w_]+') or rest:match('^[^%w_%s]+') or ''
  return lead .. word
end

--- The rest of the current line of `text`; if `text` starts a new line, that line.
---@param text string
---@return string
function M.next_line(text)
  if text:sub(1, 1) == '\n' then
    local next_line = text:sub(2):match('^[^\n]*')
    return '\n' .. next_line
  end
  return text:match('^[^\n]*')
end

local function accept_part(part_of)
  local bufnr = api.nvim_get_current_buf()
  local s = buffers:state(bufnr)
  local suggestion = s.shown
  if not suggestion then
    return false
  end
  local part = part_of(suggestion.text)
  if part == '' or #part >= #suggestion.text then
    return M.accept()
  end
  buffers:stop_timer(s)
  s.seq = s.seq + 1
  local row, col = insert_at_cursor(bufnr, part)
  s.choices = { suggestion }
  suggestion.count = 1
  suggestion.text = suggestion.text:sub(#part + 1)
  suggestion.row, suggestion.col = row, col
  suggestion.range = nil
  suggestion.tick = api.nvim_buf_get_changedtick(bufnr)
  draw(bufnr, suggestion)
  return true
end

--- Insert the next word of the suggestion. Returns false when none is shown.
---@return boolean
function M.accept_word()
  return accept_part(M.next_word)
end

--- Insert the rest of the suggestion's current line. Returns false when none is shown.
---@return boolean
function M.accept_line()
  return accept_part(M.next_line)
end

--- Drop the suggestion; returns false when none was shown.
---@return boolean
function M.dismiss()
  return buffers:dismiss(api.nvim_get_current_buf())
end

--- Whether a request for `bufnr` is still to be sent (its quiet time has not passed): when
--- false, nothing more is sent until the next keystroke.
---@param bufnr integer|nil
---@return boolean
function M.waiting(bufnr)
  return buffers:waiting(bufnr or api.nvim_get_current_buf())
end

--- Start watching `bufnr` (on LspAttach).
---@param bufnr integer
---@param opts table { debounce_ms, hl_group, client_name }
function M.attach(bufnr, opts)
  options.debounce_ms = opts.debounce_ms or options.debounce_ms
  options.hl_group = opts.hl_group or options.hl_group
  options.client_name = opts.client_name or options.client_name
  local watching = buffers:watch(bufnr, {
    { { 'TextChangedI', 'CursorMovedI' }, function(buf)
      M.on_change(buf)
    end },
    { 'InsertEnter', function(buf)
      M.schedule_request(buf)
    end },
    { { 'InsertLeave', 'BufLeave' }, function(buf)
      buffers:dismiss(buf)
    end },
  })
  if watching and in_insert_mode() and bufnr == api.nvim_get_current_buf() then
    M.schedule_request(bufnr)
  end
end

--- Stop watching `bufnr` (on LspDetach).
---@param bufnr integer
function M.detach(bufnr)
  buffers:detach(bufnr)
end

return M
