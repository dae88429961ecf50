-- Per-buffer state of a feature that asks the server in the background and shows the answer
-- (ghost text, next edits): the debounce timer, the request in flight (cancelled with
-- `$/cancelRequest` when superseded), a sequence number that turns older answers stale, the
-- buffer's autocommand group, and what is shown (`shown`, drawn in the feature's namespace).
--
-- Each feature owns one: `local requests = require('quickdraft.buffer_requests').new({...})`.

local api = vim.api

local M = {}

---@class quickdraft.BufferRequests
---@field ns integer the namespace what is shown is drawn in
---@field augroup_prefix string a buffer's augroup is this followed by its number
---@field counts table { sent, cancelled }: counted here, other fields are the feature's
---@field cancel_only_pending boolean send `$/cancelRequest` only for a request the client still holds
local BufferRequests = {}
BufferRequests.__index = BufferRequests

--- A new, empty set of buffers.
---@param opts table { ns, augroup_prefix, counts, cancel_only_pending }
---@return quickdraft.BufferRequests
function M.new(opts)
  return setmetatable({
    buffers = {},
    ns = opts.ns,
    augroup_prefix = opts.augroup_prefix,
    counts = opts.counts,
    cancel_only_pending = opts.cancel_only_pending or false,
  }, BufferRequests)
end

--- The state of `bufnr` (made when missing): { seq, timer, request, augroup, shown, ... }.
---@param bufnr integer
---@return table
function BufferRequests:state(bufnr)
  local s = self.buffers[bufnr]
  if not s then
    s = { seq = 0 }
    self.buffers[bufnr] = s
  end
  return s
end

--- What `bufnr` shows (nil when nothing, or when it is not watched).
---@param bufnr integer
---@return table|nil
function BufferRequests:shown(bufnr)
  local s = self.buffers[bufnr]
  return s and s.shown or nil
end

--- Whether `bufnr` is watched (attached and not detached since).
---@param bufnr integer
---@return boolean
function BufferRequests:watched(bufnr)
  local s = self.buffers[bufnr]
  return s ~= nil and s.augroup ~= nil
end

--- Whether `bufnr` has a request still to be sent (its quiet-time timer is running).
---@param bufnr integer
---@return boolean
function BufferRequests:waiting(bufnr)
  local s = self.buffers[bufnr]
  return s ~= nil and s.timer ~= nil
end

function BufferRequests:stop_timer(s)
  if s.timer then
    s.timer:stop()
    s.timer:close()
    s.timer = nil
  end
end

function BufferRequests:cancel_request(s)
  if s.request then
    local client = vim.lsp.get_client_by_id(s.request.client_id)
    local pending = client and (not self.cancel_only_pending or (client.requests and client.requests[s.request.id]))
    if pending and pcall(client.cancel_request, client, s.request.id) then
      self.counts.cancelled = self.counts.cancelled + 1
    end
    s.request = nil
  end
end

--- Drop what is under way for `s`: the timer, any answer still to come, the request in flight.
function BufferRequests:supersede(s)
  self:stop_timer(s)
  s.seq = s.seq + 1
  self:cancel_request(s)
end

--- Call `fn` once `ms` pass without another call for `s` (on the main loop).
---@param s table
---@param ms integer
---@param fn fun()
function BufferRequests:debounce(s, ms, fn)
  self:stop_timer(s)
  local timer = vim.uv.new_timer()
  s.timer = timer
  timer:start(ms, 0, function()
    vim.schedule(function()
      if s.timer == timer then
        self:stop_timer(s)
        fn()
      end
    end)
  end)
end

--- Send `method` for `bufnr` as the request in flight of `s`; `on_answer(result)` gets the
--- answer unless it failed, a later request or supersede() came first, or the buffer is gone.
--- Returns the request's record ({ client_id, id }), nil when it was not sent.
---@return table|nil
function BufferRequests:send(s, bufnr, client, method, params, on_answer)
  s.seq = s.seq + 1
  local seq = s.seq
  local ok, id -- (declared first: the handler below refers to `id`)
  ok, id = client:request(method, params, function(err, result)
    if s.request and s.request.id == id then
      s.request = nil
    end
    if err or seq ~= s.seq or not api.nvim_buf_is_valid(bufnr) then
      return
    end
    on_answer(result)
  end, bufnr)
  if not (ok and id) then
    return nil
  end
  s.request = { client_id = client.id, id = id }
  self.counts.sent = self.counts.sent + 1
  return s.request
end

--- Hide what `bufnr` shows (and forget it).
---@param bufnr integer
function BufferRequests:clear(bufnr)
  local s = self.buffers[bufnr]
  if s then
    s.shown = nil
  end
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, self.ns, 0, -1)
  end
end

--- Drop what `bufnr` is doing and showing: the timer, the answer to come, what is shown.
--- Whether something was shown.
---@param bufnr integer
---@return boolean
function BufferRequests:dismiss(bufnr)
  local s = self:state(bufnr)
  local was_shown = s.shown ~= nil
  self:supersede(s)
  self:clear(bufnr)
  return was_shown
end

--- Start watching `bufnr`: `autocmds` is a list of { events, fn(buf) }, made in the buffer's
--- own augroup. False (and nothing made) when it is watched already.
---@param bufnr integer
---@param autocmds table
---@return boolean
function BufferRequests:watch(bufnr, autocmds)
  local s = self:state(bufnr)
  if s.augroup then
    return false
  end
  s.augroup = api.nvim_create_augroup(self.augroup_prefix .. bufnr, { clear = true })
  for _, autocmd in ipairs(autocmds) do
    local events, fn = autocmd[1], autocmd[2]
    api.nvim_create_autocmd(events, {
      group = s.augroup,
      buffer = bufnr,
      callback = function(args)
        fn(args.buf)
      end,
    })
  end
  return true
end

--- Stop watching `bufnr`: no timer, no request, no autocommands, nothing shown, no state.
---@param bufnr integer
function BufferRequests:detach(bufnr)
  local s = self.buffers[bufnr]
  if not s then
    return
  end
  self:stop_timer(s)
  self:cancel_request(s)
  if s.augroup then
    pcall(api.nvim_del_augroup_by_id, s.augroup)
  end
  self:clear(bufnr)
  self.buffers[bufnr] = nil
end

return M
